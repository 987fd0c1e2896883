"""A thin layer over the CUDA driver API of cuda-python (cuda.bindings.driver).

It uses the device's primary context, the one PyTorch and CuPy use, so
buffers and streams of those frameworks work with aicg's kernels. Every call
is checked; a failure raises DeviceError with the driver's error name.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import DeviceError


@functools.cache
def _cu():
    from cuda.bindings import driver
    return driver


def check(result):
    cu = _cu()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise DeviceError(f"CUDA driver call failed: {name.decode() if name else err}")
    return values[0] if len(values) == 1 else (tuple(values) if values else None)


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    l2_bytes: int


@functools.cache
def probe_device(ordinal: int = 0) -> DeviceInfo | None:
    """The GPU at `ordinal`, or None on a machine without a driver or device."""
    try:
        cu = _cu()
        check(cu.cuInit(0))
        dev = check(cu.cuDeviceGet(ordinal))
        attr = cu.CUdevice_attribute
        name = check(cu.cuDeviceGetName(256, dev)).split(b"\0", 1)[0].decode()
        major = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
        minor = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
        sms = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
        l2 = check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev))
    except Exception:  # no libcuda, no device, or a driver too old: all mean "no GPU here"
        return None
    return DeviceInfo(name, (major, minor), sms, l2)


@functools.cache
def use_primary_context(ordinal: int = 0):
    cu = _cu()
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(ordinal))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    return ctx


class Buffer:
    """Device memory owned by aicg (validation and timing only)."""

    def __init__(self, nbytes: int):
        use_primary_context()
        self.nbytes = max(1, int(nbytes))
        self.ptr = int(check(_cu().cuMemAlloc(self.nbytes)))

    def upload(self, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        assert host.nbytes <= self.nbytes
        check(_cu().cuMemcpyHtoD(self.ptr, host.ctypes.data, host.nbytes))

    def download(self, dtype, count: int) -> np.ndarray:
        out = np.empty(count, dtype=dtype)
        check(_cu().cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes))
        return out

    def fill_byte(self, value: int, stream: int = 0) -> None:
        check(_cu().cuMemsetD8Async(self.ptr, value, self.nbytes, stream))

    def free(self) -> None:
        if self.ptr:
            check(_cu().cuMemFree(self.ptr))
            self.ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


_CTYPES = {"ptr": ctypes.c_void_p, "int": ctypes.c_int, "float": ctypes.c_float,
           "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "i64": ctypes.c_int64}


def _dim3(value) -> tuple[int, int, int]:
    x, y, z = (tuple(value) + (1, 1))[:3] if isinstance(value, (tuple, list)) else (value, 1, 1)
    return int(x), int(y), int(z)


class Launcher:
    """Launches of one kernel with one argument signature (`kinds`, as in Kernel.launch). Its
    argument slots are kept between launches, one set per thread: cuda-python packing a tuple
    of values anew on every launch costs microseconds of host time per call."""

    def __init__(self, function, kinds: tuple[str, ...]):
        self.function, self.kinds = function, tuple(kinds)
        self._per_thread = threading.local()

    def slots(self) -> tuple[list, int]:
        """(this thread's argument values, the address of the array of pointers to them)."""
        try:
            return self._per_thread.slots
        except AttributeError:
            values = [_CTYPES[kind]() for kind in self.kinds]
            pointers = (ctypes.c_void_p * max(1, len(values)))(*(ctypes.addressof(v) for v in values))
            # the pointer array is kept alive with the values it points to
            self._per_thread.slots = (values, ctypes.addressof(pointers))
            self._per_thread.pointers = pointers
            return self._per_thread.slots

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int], values, stream: int = 0,
                 shared_bytes: int = 0) -> None:
        slots, address = self.slots()
        if len(values) != len(slots):
            raise TypeError(f"a launch of {len(slots)} arguments was given {len(values)}")
        for slot, value in zip(slots, values):
            slot.value = value
        check(_cu().cuLaunchKernel(self.function, *grid, *block, shared_bytes, stream, address, 0))


class Kernel:
    """One entry of a loaded cubin."""

    def __init__(self, cubin: bytes, entry: str):
        use_primary_context()
        image = np.frombuffer(cubin, dtype=np.uint8)
        self.module = check(_cu().cuModuleLoadData(image.ctypes.data))
        self.function = check(_cu().cuModuleGetFunction(self.module, entry.encode()))
        self._launchers: dict[tuple[str, ...], Launcher] = {}

    def launcher(self, kinds: tuple[str, ...]) -> Launcher:
        """The launcher for arguments of these kinds ('ptr', 'int', 'float', 'u32', 'u64', 'i64')."""
        kinds = tuple(kinds)
        if kinds not in self._launchers:
            self._launchers[kinds] = Launcher(self.function, kinds)
        return self._launchers[kinds]

    def launch(self, grid, block, args: list[tuple[object, str]], stream: int = 0, shared_bytes: int = 0) -> None:
        """Launch on `stream`; grid and block are an int or an (x, y, z) tuple."""
        self.launcher(tuple(kind for _, kind in args))(_dim3(grid), _dim3(block), [value for value, _ in args],
                                                       stream, shared_bytes)

    @functools.cached_property
    def shared_bytes_limit(self) -> int:
        """The most dynamic shared memory a launch of this entry may ask for: the device's opt-in
        limit less the entry's static shared memory (raised to it once, here)."""
        cu = _cu()
        device = check(cu.cuCtxGetDevice())
        optin = check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device))
        limit = optin - self.attribute("SHARED_SIZE_BYTES")
        self.allow_shared_bytes(limit)
        return limit

    def resident_blocks(self, threads: int, shared_bytes: int) -> int:
        """Blocks of `threads` threads with `shared_bytes` of dynamic shared memory that the current
        device holds at once: the driver's occupancy for this entry times the SMs."""
        cu = _cu()
        per_sm = check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, threads, shared_bytes))
        device = check(cu.cuCtxGetDevice())
        sms = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device))
        return per_sm * sms

    def allow_shared_bytes(self, nbytes: int) -> None:
        """Raise the entry's dynamic shared memory limit (above 48 KB needs an opt-in)."""
        attr = _cu().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(_cu().cuFuncSetAttribute(self.function, attr, nbytes))

    def attribute(self, name: str) -> int:
        """A function attribute by its short name, e.g. 'NUM_REGS', 'MAX_THREADS_PER_BLOCK'."""
        attr = getattr(_cu().CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        return check(_cu().cuFuncGetAttribute(attr, self.function))

    def _global(self, name: str) -> tuple[int, int]:
        """(device address, bytes) of the module's __device__ variable `name`."""
        return check(_cu().cuModuleGetGlobal(self.module, name.encode()))

    def zero_global(self, name: str) -> None:
        """Set every byte of the module's __device__ variable `name` to zero."""
        address, size = self._global(name)
        check(_cu().cuMemsetD8(address, 0, size))

    def read_global(self, name: str, dtype, count: int) -> np.ndarray:
        """The first `count` elements of the module's __device__ variable `name`."""
        address, size = self._global(name)
        out = np.empty(count, dtype=dtype)
        if out.nbytes > size:
            raise ValueError(f"{name} holds {size} bytes, not the {out.nbytes} asked for")
        check(_cu().cuMemcpyDtoH(out.ctypes.data, address, out.nbytes))
        return out

    def unload(self) -> None:
        if self.module is not None:
            check(_cu().cuModuleUnload(self.module))
            self.module = None


def synchronize() -> None:
    check(_cu().cuCtxSynchronize())


class EventTimer:
    """Device-side elapsed time between two recorded events, in milliseconds."""

    def __init__(self):
        use_primary_context()
        self.start = check(_cu().cuEventCreate(0))
        self.end = check(_cu().cuEventCreate(0))

    def time(self, work, stream: int = 0) -> float:
        cu = _cu()
        check(cu.cuEventRecord(self.start, stream))
        work()
        check(cu.cuEventRecord(self.end, stream))
        check(cu.cuEventSynchronize(self.end))
        return check(cu.cuEventElapsedTime(self.start, self.end))
