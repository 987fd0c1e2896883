"""Functions the isolated-worker tests (test_isolated.py) call in the worker process."""
import os
import time

from aicg.errors import DeviceError


def add(a, b):
    return {"sum": a + b, "pid": os.getpid()}


def fault():
    raise DeviceError("CUDA driver call failed: CUDA_ERROR_ILLEGAL_ADDRESS")


def die():
    os._exit(3)


def hang(seconds):
    time.sleep(seconds)


def wrong():
    raise ValueError("a bug, not a fault")


def unpackable():
    return object()
