"""How a launch hands its arguments to the driver, and how an output is allocated, without a GPU:
the driver and the array framework are stand-ins."""
from __future__ import annotations

import ctypes
import sys
import threading
import types

import pytest

from aicg.runtime import arrays, driver


class RecordingDriver:
    """cuLaunchKernel reading back, through the pointer array it is given, four arguments of
    kinds ptr, int, float and i64."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self):
        self.launches = []

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        at = (ctypes.c_void_p * 4).from_address(params)
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), shared, stream,
                              ctypes.c_void_p.from_address(at[0]).value, ctypes.c_int.from_address(at[1]).value,
                              ctypes.c_float.from_address(at[2]).value, ctypes.c_int64.from_address(at[3]).value))
        return (0,)


@pytest.fixture
def recording(monkeypatch):
    fake = RecordingDriver()
    monkeypatch.setattr(driver, "_cu", lambda: fake)
    return fake


def test_each_launch_passes_its_own_values_in_order(recording):
    launch = driver.Launcher("f", ("ptr", "int", "float", "i64"))
    launch((3, 1, 1), (128, 1, 1), [1 << 40, -7, 0.5, 1 << 33], stream=9)
    launch((1, 1, 1), (32, 1, 1), [8, 7, 2.0, 3], shared_bytes=64)
    assert recording.launches == [("f", (3, 1, 1), (128, 1, 1), 0, 9, 1 << 40, -7, 0.5, 1 << 33),
                                  ("f", (1, 1, 1), (32, 1, 1), 64, 0, 8, 7, 2.0, 3)]
    with pytest.raises(TypeError, match="4 arguments was given 3"):
        launch((1, 1, 1), (32, 1, 1), [8, 7, 2.0])


def test_threads_fill_separate_argument_slots(recording):
    launch = driver.Launcher("f", ("ptr", "int", "float", "i64"))
    mine, theirs = launch.slots(), []
    worker = threading.Thread(target=lambda: theirs.append(launch.slots()))
    worker.start()
    worker.join()
    assert launch.slots() is mine and theirs[0][1] != mine[1]


def test_kernel_launch_takes_values_with_their_kinds(recording):
    kernel = driver.Kernel.__new__(driver.Kernel)
    kernel.function, kernel._launchers = "g", {}
    kernel.launch(5, (64, 2), [(16, "ptr"), (3, "int"), (1.5, "float"), (-2, "i64")], stream=4)
    assert recording.launches == [("g", (5, 1, 1), (64, 2, 1), 0, 4, 16, 3, 1.5, -2)]
    assert kernel.launcher(("ptr", "int", "float", "i64")) is kernel.launcher(["ptr", "int", "float", "i64"])


class FakeTensor:
    """What the runtime asks of a PyTorch tensor when it allocates an output like it."""
    __module__ = "torch.fake"

    def __init__(self, shape, address=4096):
        self.shape, self.address = tuple(shape), address

    def new_empty(self, shape):
        return FakeTensor(shape, self.address + (1 << 20))

    def data_ptr(self):
        return self.address


def test_an_output_is_allocated_dense_like_its_input_on_the_current_stream(monkeypatch):
    fake_torch = types.SimpleNamespace(_C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda device: 1000 + device))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    x = arrays.DeviceArray(FakeTensor((4, 3, 10)), 4096, (4, 3, 10), "bfloat16", 2, 16)
    y = arrays.empty_like(x, (4, 3))
    assert isinstance(y.obj, FakeTensor) and y.obj.shape == (4, 3)
    assert (y.ptr, y.shape, y.dtype, y.device, y.dense) == (y.obj.data_ptr(), (4, 3), "bfloat16", 2, True)
    assert arrays.current_stream(x) == 1002
