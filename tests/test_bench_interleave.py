"""The benchmark times a case's contenders interleaved (tests/bench/interleave.py)."""
from __future__ import annotations

import statistics

import pytest


@pytest.fixture
def interleave(bench_module):
    return bench_module("interleave")


CONTENDERS = ("aicg", "eager", "compile", "triton", "copy")


def test_every_round_times_every_contender_once_first_in_turn(interleave):
    order = []
    times = interleave.rounds({name: name for name in CONTENDERS}, 7, lambda call: order.append(call) or 1.0)
    assert {name: len(t) for name, t in times.items()} == dict.fromkeys(CONTENDERS, 7)
    rounds = [order[i:i + len(CONTENDERS)] for i in range(0, len(order), len(CONTENDERS))]
    assert all(sorted(r) == sorted(CONTENDERS) for r in rounds)
    assert [r[0] for r in rounds] == ["aicg", "eager", "compile", "triton", "copy", "aicg", "eager"]


def test_a_transient_of_the_run_falls_on_every_contender_alike(interleave):
    # the first ten timings of the run are slow, whoever is timed: timed one contender after another,
    # all ten would fall on the first, and its median with them
    calls = iter(range(10_000))
    times = interleave.rounds(dict.fromkeys(CONTENDERS), 20, lambda _: 135.0 if next(calls) < 10 else 118.0)
    assert {name: sum(t == 135.0 for t in ts) for name, ts in times.items()} == dict.fromkeys(CONTENDERS, 2)
    assert {name: statistics.median(ts) for name, ts in times.items()} == dict.fromkeys(CONTENDERS, 118.0)


def test_each_contender_keeps_its_own_times(interleave):
    seconds = {"aicg": 1.0, "eager": 2.0, "copy": 3.0}
    times = interleave.rounds({name: name for name in seconds}, 4, lambda call: seconds[call])
    assert times == {name: [s] * 4 for name, s in seconds.items()}


class _Item:   # a pytest item as interleave.selected reads it
    def __init__(self, **params):
        self.callspec = type("CallSpec", (), {"params": params})()


def test_only_the_contenders_the_run_selected_are_timed_in_their_order(interleave):
    case = ("acceptance", "softmax", "float32", (32768, 4096))
    items = [_Item(suite="acceptance", op="softmax", dtype="float32", shape=(32768, 4096), contender=c)
             for c in ("copy", "aicg", "triton")]
    items += [_Item(suite="grid", op="softmax", dtype="float32", shape=(32768, 4096), contender="eager"),
              _Item(suite="acceptance", op="softmax", dtype="float32", shape=(4096, 32768), contender="compile"),
              object()]   # a test with no parameters
    assert interleave.selected(items, case, CONTENDERS) == ["aicg", "triton", "copy"]
    assert interleave.selected(items, ("grid", "row_sum", "float32", (1, 1)), CONTENDERS) == []
