"""The device side of probing: compile probe kernels, allocate, launch, time.

Probe kernels live in kernels/probes/*.cu and are compiled by NVRTC for the
device's own architecture (or a named variant such as sm_90a for wgmma).
Timing is by device events; `repeat` gives one figure's repetitions, each
the median of several timed launches. Clocks and throttle state are read
from nvidia-smi where the node has it, so every figure records the clocks
it ran under.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import sys

from .. import cli_layout, nvrtc
from ..errors import DeviceError
from ..runtime import driver

KERNELS_DIR = cli_layout.shipped("kernels")
PROBE_KERNELS = "probes"

# Attributes read once per device; names are CUdevice_attribute without its prefix.
ATTRIBUTES = ("MULTIPROCESSOR_COUNT", "WARP_SIZE", "MAX_THREADS_PER_BLOCK", "MAX_THREADS_PER_MULTIPROCESSOR",
              "MAX_BLOCKS_PER_MULTIPROCESSOR", "MAX_REGISTERS_PER_MULTIPROCESSOR", "MAX_REGISTERS_PER_BLOCK",
              "MAX_SHARED_MEMORY_PER_BLOCK", "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
              "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", "L2_CACHE_SIZE", "CLOCK_RATE", "MEMORY_CLOCK_RATE",
              "GLOBAL_MEMORY_BUS_WIDTH", "COMPUTE_CAPABILITY_MAJOR", "COMPUTE_CAPABILITY_MINOR")

_SMI_FIELDS = "clocks.sm,clocks.mem,clocks_event_reasons.active,temperature.gpu,power.draw"


def compile_probe(file: str, arch: str) -> bytes:
    """The cubin of kernels/probes/<file> for `arch` (NVRTC; no GPU needed)."""
    name = f"{PROBE_KERNELS}/{file}"
    source = (KERNELS_DIR / name).read_text(encoding="utf-8")
    headers = nvrtc.include_closure(name, KERNELS_DIR)
    headers.pop(name)
    cubin, _report, _log = nvrtc.compile_cubin(source, name, headers, arch)
    return cubin


class ProbeGPU:
    """One CUDA device, as the probes use it."""

    def __init__(self, ordinal: int = 0, progress=None):
        info = driver.probe_device(ordinal)
        if info is None:
            raise DeviceError("no CUDA device or driver here: `doit probe` runs on a GPU node")
        driver.use_primary_context(ordinal)
        self.ordinal, self.name = ordinal, info.name
        self.compute_capability = info.compute_capability
        self.arch = "sm_%d%d" % info.compute_capability
        cu = driver._cu()
        dev = driver.check(cu.cuDeviceGet(ordinal))
        self.attributes = {a: driver.check(cu.cuDeviceGetAttribute(getattr(cu.CUdevice_attribute,
                                                                           f"CU_DEVICE_ATTRIBUTE_{a}"), dev))
                           for a in ATTRIBUTES}
        self.total_memory = int(driver.check(cu.cuDeviceTotalMem(dev)))
        self.driver_version = self._driver_version()
        self.timer = driver.EventTimer()
        self._progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
        self._kernels: dict[tuple[str, str, str], driver.Kernel] = {}
        self._cubins: dict[tuple[str, str], bytes] = {}
        self._buffers: list[driver.Buffer] = []

    @property
    def sm_count(self) -> int:
        return self.attributes["MULTIPROCESSOR_COUNT"]

    def _driver_version(self) -> str:
        smi = self.smi("driver_version")
        if smi:
            return smi
        version = driver.check(driver._cu().cuDriverGetVersion())
        return f"CUDA {version // 1000}.{version % 1000 // 10}"

    def smi(self, fields: str) -> str | None:
        """nvidia-smi's CSV answer for `fields`, or None where the node has no nvidia-smi."""
        if not shutil.which("nvidia-smi"):
            return None
        try:
            out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                                  "-i", str(self.ordinal)], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    def clocks(self) -> str:
        """SM and memory clocks, throttle reasons, temperature and power, now."""
        answer = self.smi(_SMI_FIELDS)
        if answer is None:
            return f"sm {self.attributes['CLOCK_RATE'] // 1000} MHz max (no nvidia-smi: current clocks unknown)"
        sm, mem, reasons, temp, power = [v.strip() for v in answer.split(",")]
        return f"sm {sm} MHz, mem {mem} MHz, throttle {reasons}, {temp} C, {power} W"

    def kernel(self, file: str, entry: str, arch: str | None = None) -> driver.Kernel:
        arch = arch or self.arch
        key = (file, entry, arch)
        if key not in self._kernels:
            if (file, arch) not in self._cubins:       # one compilation per file, however many entries
                self._cubins[file, arch] = compile_probe(file, arch)
            self._kernels[key] = driver.Kernel(self._cubins[file, arch], entry)
        return self._kernels[key]

    def buffer(self, nbytes: int) -> driver.Buffer:
        """Device memory freed by close(); filled with a non-zero byte pattern (never time on zeros)."""
        buf = driver.Buffer(nbytes)
        buf.fill_byte(0x3C)
        self._buffers.append(buf)
        return buf

    def release(self, buf: driver.Buffer) -> None:
        self._buffers.remove(buf)
        buf.free()

    def time_ms(self, work) -> float:
        return self.timer.time(work)

    def repeat(self, work, repetitions: int = 7, launches: int = 5, warmup: int = 2) -> list[float]:
        """`repetitions` samples in milliseconds, each the median of `launches` timed runs of `work`."""
        for _ in range(warmup):
            work()
        driver.synchronize()
        return [statistics.median(self.timer.time(work) for _ in range(launches)) for _ in range(repetitions)]

    def progress(self, line: str) -> None:
        self._progress(line)

    def synchronize(self) -> None:
        driver.synchronize()

    def close(self) -> None:
        for buf in self._buffers:
            buf.free()
        self._buffers.clear()
        for k in self._kernels.values():
            k.unload()
        self._kernels.clear()
