"""Device arrays from any framework, through DLPack or __cuda_array_interface__.

cuda.core's StridedMemoryView reads either protocol; the framework itself is
only asked for two things it alone knows: how to allocate a result like an
input, and which stream is current.
"""
from __future__ import annotations

import sys
from typing import NamedTuple


class DeviceArray(NamedTuple):   # a tuple: built on every call, it must be cheap to make
    obj: object
    ptr: int
    shape: tuple[int, ...]
    dtype: str
    device: int
    row_stride: int     # elements from one row (last dimension) to the next; shape[-1] when dense

    @property
    def dense(self) -> bool:
        return not self.shape or self.row_stride == self.shape[-1]


def _dtype_name(view, obj) -> str:
    try:
        return view.dtype.name
    except Exception:  # a dtype numpy cannot name (bfloat16 without ml_dtypes): ask the framework
        return str(getattr(obj, "dtype", "unknown")).rsplit(".", 1)[-1]


def row_stride(what: str, shape: tuple[int, ...], strides) -> int:
    """Elements from one row to the next, where the array is rows of contiguous elements lying
    evenly apart (a slice of a wider matrix, say); a ValueError naming `what` otherwise."""
    if not shape:
        return 1
    if strides is None:
        return shape[-1]
    cols = shape[-1]
    if cols > 1 and strides[-1] != 1:
        raise ValueError(f"{what}: expected contiguous rows (last stride 1), got strides {tuple(strides)} "
                         f"for shape {shape}")
    # Dimensions of one entry say nothing about spacing; the rest must nest evenly.
    outer = [(n, st) for n, st in zip(shape[:-1], strides[:-1]) if n > 1]
    if not outer:
        return cols
    step = outer[-1][1]
    expected = step
    for n, st in reversed(outer):
        if st != expected:
            raise ValueError(f"{what}: rows must lie evenly apart, got strides {tuple(strides)} for shape {shape}")
        expected = st * n
    if step < cols:
        raise ValueError(f"{what}: rows overlap (row stride {step} for rows of {cols}), shape {shape}")
    return step


def _torch_view(t, what: str) -> DeviceArray:
    """A PyTorch tensor read directly: a protocol round trip costs more host time than the launch itself."""
    if not t.is_cuda:
        raise TypeError(f"{what}: expected an array in GPU memory, got one in host memory")
    shape = tuple(t.shape)
    stride = shape[-1] if t.is_contiguous() else row_stride(what, shape, t.stride())
    return DeviceArray(t, t.data_ptr(), shape, str(t.dtype).rsplit(".", 1)[-1], t.get_device(), stride)


def view(obj, what: str) -> DeviceArray:
    if framework(obj) == "torch":
        return _torch_view(obj, what)
    from cuda.core.utils import StridedMemoryView
    try:
        v = StridedMemoryView.from_any_interface(obj, stream_ptr=-1)
    except Exception as err:
        raise TypeError(f"{what}: expected a CUDA array (DLPack or __cuda_array_interface__), got {type(obj).__name__}: {err}") from None
    if not v.is_device_accessible or v.device_id < 0:
        raise TypeError(f"{what}: expected an array in GPU memory, got one in host memory")
    shape = tuple(v.shape)
    return DeviceArray(obj, int(v.ptr), shape, _dtype_name(v, obj), v.device_id, row_stride(what, shape, v.strides))


def torch_signature(tensors) -> tuple[tuple, tuple[int, ...]] | None:
    """(each tensor's shape, strides, dtype and GPU; their addresses) where every one is a PyTorch
    CUDA tensor or None (0 for its address), else None: the part of a call's arguments that decides
    its kernel and launch, read in a fraction of the time the checks of a first call take."""
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)
    if tensor is None:
        return None
    key, pointers = [], []
    for t in tensors:
        if t is None:
            key.append(None)
            pointers.append(0)
            continue
        if not isinstance(t, tensor) or not t.is_cuda:
            return None
        pointers.append(t.data_ptr())
        key.append((t.shape, t.stride(), t.dtype, t.get_device()))
    return tuple(key), tuple(pointers)


def framework(obj) -> str:
    """The package the array's type comes from ("torch", "cupy", ...); a subclass of PyTorch's tensor
    defined elsewhere (a library's) counts as PyTorch's."""
    name = type(obj).__module__.split(".", 1)[0]
    if name != "torch" and isinstance(obj, getattr(sys.modules.get("torch"), "Tensor", ())):
        return "torch"
    return name


def _new_torch(like, shape):
    array = like.new_empty(shape)
    return array, array.data_ptr()


def _new_cupy(like, shape):
    array = sys.modules["cupy"].empty(shape, dtype=like.dtype)
    return array, array.data.ptr


_ALLOCATE = {"torch": _new_torch, "cupy": _new_cupy}   # (a new array like `like`, its device address)


def torch_current_stream(like, device: int) -> int:
    """PyTorch's current stream on GPU `device` (`like`: a tensor there)."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # the pointer, with no Stream object built
    return raw(device) if raw is not None else torch.cuda.current_stream(like.device).cuda_stream


_CURRENT_STREAM = {
    "torch": torch_current_stream,
    "cupy": lambda like, device: sys.modules["cupy"].cuda.get_current_stream().ptr,
}


def empty_like(like: DeviceArray, shape: tuple[int, ...]) -> DeviceArray:
    """A new dense array of `shape`, of the framework, dtype and device of `like`."""
    made_by = framework(like.obj)
    if made_by not in _ALLOCATE:
        raise TypeError(f"cannot allocate an output like a {type(like.obj).__name__}; pass out=")
    array, ptr = _ALLOCATE[made_by](like.obj, shape)
    return DeviceArray(array, ptr, tuple(shape), like.dtype, like.device, shape[-1] if shape else 1)


def current_stream(like: DeviceArray) -> int:
    """The stream the array's framework is issuing work on (0, the legacy default, if unknown)."""
    made_by = framework(like.obj)
    return _CURRENT_STREAM[made_by](like.obj, like.device) if made_by in _CURRENT_STREAM else 0
