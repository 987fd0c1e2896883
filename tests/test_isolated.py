"""aicg/validate/isolated.py: a call in a worker process that a fault, an exit or a hang ends, the
caller unharmed and the next call served by a fresh worker. No GPU needed: the targets
(isolated_targets.py) stand in for a kernel that faults, crashes the process or never finishes."""
import os

import pytest

from aicg.validate import isolated


@pytest.fixture
def worker():
    w = isolated.Worker()
    yield w
    w._stop()


def test_a_call_is_answered_by_one_worker_process_that_serves_the_next_too(worker):
    first = worker.call("isolated_targets:add", [2, 3])["result"]
    second = worker.call("isolated_targets:add", kwargs={"a": b"x", "b": b"y"})["result"]
    assert first["sum"] == 5 and second["sum"] == b"xy"
    assert first["pid"] == second["pid"] != os.getpid()


@pytest.mark.parametrize("target, args, fault", [
    ("isolated_targets:fault", [], "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("isolated_targets:die", [], "exit code 3"),
    ("isolated_targets:hang", [30], "no answer within 2 s"),
])
def test_a_fault_an_exit_or_a_hang_is_a_result_and_the_next_call_gets_a_fresh_worker(worker, target, args, fault):
    before = worker.call("isolated_targets:add", [1, 1])["result"]["pid"]
    worker.seconds = 2
    assert fault in worker.call(target, args)["fault"]
    worker.seconds = isolated.SECONDS
    after = worker.call("isolated_targets:add", [1, 1])["result"]
    assert after["sum"] == 2 and after["pid"] != before


@pytest.mark.parametrize("target, says", [("isolated_targets:wrong", "a bug, not a fault"),
                                          ("isolated_targets:unpackable", "TypeError")])
def test_any_other_exception_in_the_worker_is_raised_in_the_caller_and_the_worker_goes_on(worker, target, says):
    pid = worker.call("isolated_targets:add", [1, 1])["result"]["pid"]
    with pytest.raises(RuntimeError, match=says):
        worker.call(target)
    assert worker.call("isolated_targets:add", [1, 1])["result"]["pid"] == pid


def test_the_worker_s_stdout_does_not_reach_the_replies(worker, capfd):
    assert worker.call("builtins:print", ["noise on stdout"])["result"] is None
    assert worker.call("isolated_targets:add", [1, 2])["result"]["sum"] == 3
    assert "noise on stdout" in capfd.readouterr().err     # it went to the worker's stderr
