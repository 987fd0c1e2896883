"""Launching a compiled matrix realisation on the current GPU.

`check_arguments` is the host-side check of a call (no GPU needed): the
realisation takes the problem, the pointers it needs are there and aligned.
`MatmulKernel` loads a cubin, raises the entry's dynamic shared memory limit
where the ring needs more than 48 KB, sizes the grid (persistent
realisations: the CTAs, or clusters, the GPU holds at once), encodes the TMA
descriptors, keeps the decode kernel's split-K scratch memory, and launches:
cuLaunchKernelEx with the cluster dimension for clustered realisations,
cuLaunchKernel otherwise.
"""
from __future__ import annotations

import ctypes
import functools

from ..runtime import driver
from . import codegen, tensormap
from .problem import Problem
from .space import Realisation
from .templates import RULES
from .templates.base import ELEMENT_BYTES, Geometry


def check_arguments(real: Realisation, problem: Problem, pointers: dict[str, int]) -> None:
    """ValueError unless `real` can compute `problem` with these device pointers (a, b, c, and bias
    and residual where the epilogue has them)."""
    rules = RULES[real.template]
    reason = rules.unsupported(real, problem)
    if reason:
        raise ValueError(f"{real.name} cannot compute {problem.name}: {reason}")
    needed = ["a", "b", "c"] + (["bias"] if problem.epilogue.bias else []) + \
             (["residual"] if problem.epilogue.residual else [])
    for name in needed:
        if not pointers.get(name):
            raise ValueError(f"{real.name}: the {name} pointer is missing or null")
    for name in pointers:
        if name not in ("a", "b", "c", "bias", "residual"):
            raise ValueError(f"{real.name}: unknown operand {name!r}")
    alignment = rules.operand_alignment(real)
    for name in needed:
        want = alignment if name in ("a", "b") else ELEMENT_BYTES
        if pointers[name] % want:
            raise ValueError(f"{real.name}: {name} at {pointers[name]:#x} is not {want}-byte aligned")


class MatmulKernel:
    def __init__(self, real: Realisation, cubin: bytes):
        self.real, self.rules = real, RULES[real.template]
        self.kernel = driver.Kernel(cubin, codegen.ENTRY)
        self.shared_bytes = self.rules.dynamic_shared_bytes(real)
        if self.shared_bytes > 48 * 1024:
            self.kernel.allow_shared_bytes(self.shared_bytes)
        cu = _cu()
        device = driver.check(cu.cuCtxGetDevice())
        self.sm_count = driver.check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device))
        self._scratch: dict[str, driver.Buffer] = {}

    @functools.cached_property
    def resident_clusters(self) -> int | None:
        """Clusters of this realisation the GPU holds at once (None: not clustered)."""
        cluster = self.real.settings.get("cluster_m", 1)
        if cluster == 1:
            return None
        cu = _cu()
        config = _config((cluster, 1, 1), (self.rules.threads(self.real), 1, 1), self.shared_bytes, 0, cluster)
        return int(driver.check(cu.cuOccupancyMaxActiveClusters(self.kernel.function, config)))

    def geometry(self, problem: Problem) -> Geometry:
        return self.rules.geometry(self.real, problem, self.sm_count, self.resident_clusters)

    def _scratch_buffer(self, name: str, nbytes: int, zeroed: bool) -> int:
        buffer = self._scratch.get(name)
        if buffer is None or buffer.nbytes < nbytes:
            if buffer is not None:
                buffer.free()
            buffer = driver.Buffer(nbytes)
            if zeroed:
                buffer.fill_byte(0)
                driver.synchronize()
            self._scratch[name] = buffer
        return buffer.ptr

    def launch(self, problem: Problem, pointers: dict[str, int], stream: int = 0) -> Geometry:
        """Launch on `stream` (no synchronisation); returns the launch's geometry."""
        check_arguments(self.real, problem, pointers)
        geometry = self.geometry(problem)
        values = {"m": problem.m, "n": problem.n, "k": problem.k, "lda": problem.lda, "ldb": problem.ldb,
                  "ldc": problem.ldc, "ldr": problem.ldr}
        if self.real.template == "gemv":
            values["k_split"] = self.rules.k_split(self.real, problem, self.sm_count)
        keep = []          # objects whose memory the argument array points into
        slots = []
        for kind, name in self.rules.arguments:
            if kind == "tensor_map":
                tmap = tensormap.encode(tensormap.spec(self.real, problem, name), pointers[name])
                keep.append(tmap)
                slots.append(int(tmap.getPtr()))
                continue
            if kind == "pointer":
                if name == "workspace":
                    value = self._scratch_buffer("workspace", geometry.workspace_bytes, False) \
                        if geometry.workspace_bytes else 0
                elif name == "tickets":
                    value = self._scratch_buffer("tickets", geometry.ticket_bytes, True)
                else:
                    value = pointers.get(name, 0)
                holder = ctypes.c_void_p(value)
            else:
                holder = ctypes.c_int(values[name])
            keep.append(holder)
            slots.append(ctypes.addressof(holder))
        params = (ctypes.c_void_p * len(slots))(*slots)
        cu = _cu()
        if geometry.cluster > 1:
            config = _config(geometry.grid, geometry.block, geometry.shared_bytes, stream, geometry.cluster)
            driver.check(cu.cuLaunchKernelEx(config, self.kernel.function, ctypes.addressof(params), 0))
        else:
            driver.check(cu.cuLaunchKernel(self.kernel.function, *geometry.grid, *geometry.block,
                                           geometry.shared_bytes, stream, ctypes.addressof(params), 0))
        del keep   # the driver copied the arguments at the launch
        return geometry

    def close(self) -> None:
        for buffer in self._scratch.values():
            buffer.free()
        self._scratch.clear()
        self.kernel.unload()


def _cu():
    from cuda.bindings import driver as cu
    return cu


def _config(grid, block, shared_bytes: int, stream: int, cluster: int):
    cu = _cu()
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_bytes
    config.hStream = cu.CUstream(stream)
    attribute = cu.CUlaunchAttribute()
    attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = cluster, 1, 1
    config.attrs = [attribute]
    config.numAttrs = 1
    return config
