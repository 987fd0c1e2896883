"""The GPU a run is on, as the matrix family's constraints see it.

The limits come from the hwdb entry whose identity names this device
(measured facts beat datasheet ones there); a device no entry names is read
from the driver's attributes instead. No GPU is named in code.
"""
from __future__ import annotations

from pathlib import Path

from .. import hw
from ..runtime import driver
from .templates.base import GpuLimits

HWDB_DIR = Path(__file__).resolve().parents[2] / "hwdb"


def hardware_entry(name: str, hwdb_dir: Path = HWDB_DIR):
    """The hwdb record whose identity name is `name`, or None."""
    for path in sorted(Path(hwdb_dir).glob("*.toml")):
        record = hw.load(path)
        if record.name == name:
            return record
    return None


def limits(hwdb_dir: Path = HWDB_DIR) -> tuple[GpuLimits, object]:
    """(the limits of this machine's GPU, its hwdb record or None); RuntimeError without a GPU."""
    info = driver.probe_device()
    if info is None:
        raise RuntimeError("no CUDA GPU on this machine")
    record = hardware_entry(info.name, hwdb_dir)
    if record is not None and tuple(record.compute_capability) == tuple(info.compute_capability):
        return GpuLimits.of_hardware(record), record
    from cuda.bindings import driver as cu
    driver.use_primary_context()
    device = driver.check(cu.cuCtxGetDevice())
    attr = cu.CUdevice_attribute

    def get(a):
        return int(driver.check(cu.cuDeviceGetAttribute(a, device)))
    return GpuLimits(tuple(info.compute_capability), get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
                     255, info.sm_count), None
