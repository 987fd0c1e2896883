"""Calls in a process of their own, for running kernels that are not trusted yet.

A kernel that faults (an illegal address, say) leaves the CUDA context it ran in unusable: every
later call in that process fails. Run in the process that asked, one such candidate would end a
build, or the user's program whose first call of a new shape was being validated. Here the call
runs in a worker process, which a fault ends instead; the caller gets the fault as a result, and
the next call gets a fresh worker. A call that does not answer within its time limit (a kernel
that never finishes) is treated the same way.

The worker is a fresh interpreter (`python -m aicg.validate.isolated`), not a fork (which would
copy the caller's CUDA context and threads) nor a multiprocessing spawn (which imports the
caller's main script again). It imports from the caller's sys.path. Requests and replies are
msgpack frames on a pipe of their own; the worker's stdout goes to its stderr.
"""
from __future__ import annotations

import importlib
import os
import select
import struct
import subprocess
import sys
import threading
import traceback

import msgpack

SECONDS = 600     # far beyond any validation measured, short of a hung build
_LENGTH = struct.Struct("<Q")


class Worker:
    """One worker process at a time, started on first use and after each fault."""

    def __init__(self, seconds: float = SECONDS):
        self.seconds = seconds        # a call's time limit
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def call(self, target: str, args: list | None = None, kwargs: dict | None = None) -> dict:
        """{"result": target(*args, **kwargs)} from the worker (target is "module:function"), or
        {"fault": what happened} where a DeviceError, the worker's end or the time limit stopped
        it. Any other exception in the worker is raised here, as a RuntimeError with its traceback."""
        seconds = self.seconds
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            try:
                _write(self._process.stdin, {"target": target, "args": args or [], "kwargs": kwargs or {}})
                reply = _read(self._process.stdout, seconds)
            except TimeoutError:
                self._stop()
                return {"fault": f"no answer within {seconds:g} s: the worker was stopped"}
            except (EOFError, BrokenPipeError):
                code = self._stop()
                return {"fault": f"the worker process ended (exit code {code})"}
            if "fault" in reply:
                self._stop()
                return reply
            if "error" in reply:
                raise RuntimeError(f"{target} failed in the worker process:\n{reply['error']}")
            return reply

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._process = subprocess.Popen([sys.executable, "-m", "aicg.validate.isolated"], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def _stop(self) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
        code = process.wait()
        process.stdin.close()
        process.stdout.close()
        return code


def _write(stream, message: dict) -> None:
    data = msgpack.packb(message)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _read_exactly(stream, n: int, seconds: float | None) -> bytes:
    data = b""
    while len(data) < n:
        if seconds is not None and not select.select([stream], [], [], seconds)[0]:
            raise TimeoutError
        chunk = os.read(stream.fileno(), n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _read(stream, seconds: float | None = None) -> dict:
    (length,) = _LENGTH.unpack(_read_exactly(stream, _LENGTH.size, seconds))
    return msgpack.unpackb(_read_exactly(stream, length, seconds))


def serve() -> None:
    """The worker: answer requests on stdin through the original stdout until stdin closes."""
    from ..errors import DeviceError
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)          # whatever else writes to stdout (a library, a driver) goes to stderr
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    while True:
        try:
            request = _read(requests)
        except EOFError:
            return
        module, name = request["target"].split(":")
        try:
            result = getattr(importlib.import_module(module), name)(*request["args"], **request["kwargs"])
            reply = {"result": result}
            msgpack.packb(reply)      # a result msgpack cannot carry is an error, not a fault
        except DeviceError as err:
            _write(replies, {"fault": str(err)})
            return      # the context may be lost: this process serves no more
        except Exception:
            reply = {"error": traceback.format_exc()}
        _write(replies, reply)


worker = Worker()

if __name__ == "__main__":
    serve()
