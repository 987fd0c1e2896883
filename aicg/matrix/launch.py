"""Launching a compiled matrix realisation on the current GPU.

`check_arguments` is the host-side check of a call (no GPU needed): the
realisation takes the problem, the pointers it needs are there and aligned.
`MatmulKernel` loads a cubin, raises the entry's dynamic shared memory limit
where the ring needs more than 48 KB, sizes the grid (persistent
realisations: the CTAs, or clusters, the GPU holds at once; the decode
kernel: the CTAs one wave holds, from the driver's occupancy), encodes the
TMA descriptors, keeps the split-K scratch memory, and launches:
cuLaunchKernelEx with the cluster dimension for clustered realisations,
cuLaunchKernel otherwise.

A launch's preparation (checks, geometry, descriptors, the argument array)
is kept for the next launch of the same problem on the same pointers and
stream, so that a repeated launch costs one driver call: a benchmark's
timed launches then measure the kernel, not the host.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from ..runtime import driver
from . import codegen, tensormap
from .problem import Problem
from .space import Realisation
from .templates import RULES
from .templates.base import ELEMENT_BYTES, Geometry

PREPARED_KEPT = 8        # launches kept prepared (problems x pointer sets x streams)


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


@dataclass
class _Prepared:
    """One launch ready to go again: its geometry, the argument array and what it points into."""
    geometry: Geometry
    params: object          # ctypes array of argument addresses
    keep: list              # the objects those addresses lie in
    config: object = None   # cuLaunchKernelEx's configuration (clustered realisations)


class MatmulKernel:
    def __init__(self, real: Realisation, cubin: bytes):
        self.real, self.rules = real, RULES[real.template]
        self.kernel = driver.Kernel(cubin, codegen.ENTRY)
        self.shared_bytes = self.rules.dynamic_shared_bytes(real)
        # beyond 48 KiB a block (static and dynamic together) needs the opt-in: a 48 KiB ring beside
        # a few static bytes failed to launch without it
        if self.shared_bytes + self.kernel.attribute("SHARED_SIZE_BYTES") > 48 * 1024:
            self.kernel.allow_shared_bytes(self.shared_bytes)
        cu = _cu()
        device = driver.check(cu.cuCtxGetDevice())
        self.sm_count = driver.check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device))
        self._scratch: dict[str, driver.Buffer] = {}
        self._prepared: dict[tuple, _Prepared] = {}

    @functools.cached_property
    def resident_clusters(self) -> int | None:
        """Clusters of this realisation the GPU holds at once (None: not clustered)."""
        cluster = self.rules.cluster(self.real)
        if cluster == 1:
            return None
        cu = _cu()
        config = _config((cluster, 1, 1), (self.rules.threads(self.real), 1, 1), self.shared_bytes, 0, cluster)
        return int(driver.check(cu.cuOccupancyMaxActiveClusters(self.kernel.function, config)))

    @functools.cached_property
    def blocks_per_sm(self) -> int:
        """CTAs of this kernel an SM holds at once (the driver's occupancy: registers, shared memory)."""
        cu = _cu()
        found = driver.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self.kernel.function, self.rules.threads(self.real), self.shared_bytes))
        return max(1, int(found))

    def geometry(self, problem: Problem) -> Geometry:
        return self.rules.geometry(self.real, problem, self.sm_count, self.resident_clusters,
                                   blocks_per_sm=self.blocks_per_sm)

    def _scratch_buffer(self, name: str, nbytes: int, zeroed: bool) -> int:
        buffer = self._scratch.get(name)
        if buffer is None or buffer.nbytes < nbytes:
            if buffer is not None:
                buffer.free()
            self._prepared.clear()      # prepared launches point into the old buffer
            buffer = driver.Buffer(nbytes)
            if zeroed:
                buffer.fill_byte(0)
                driver.synchronize()
            self._scratch[name] = buffer
        return buffer.ptr

    def _prepare(self, problem: Problem, pointers: dict[str, int], stream: int) -> _Prepared:
        check_arguments(self.real, problem, pointers)
        geometry = self.geometry(problem)
        values = {"m": problem.m, "n": problem.n, "k": problem.k, "lda": problem.lda, "ldb": problem.ldb,
                  "ldc": problem.ldc, "ldr": problem.ldr}
        if self.real.template == "gemv":
            values["k_split"] = self.rules.k_split(self.real, problem, self.sm_count, self.blocks_per_sm)
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
                    value = self._scratch_buffer("tickets", geometry.ticket_bytes, True) \
                        if geometry.ticket_bytes else 0
                else:
                    value = pointers.get(name, 0)
                holder = ctypes.c_void_p(value)
            else:
                holder = ctypes.c_int(values[name])
            keep.append(holder)
            slots.append(ctypes.addressof(holder))
        params = (ctypes.c_void_p * len(slots))(*slots)
        config = None
        if geometry.cluster > 1:
            config = _config(geometry.grid, geometry.block, geometry.shared_bytes, stream, geometry.cluster)
        return _Prepared(geometry, params, keep, config)

    def launch(self, problem: Problem, pointers: dict[str, int], stream: int = 0) -> Geometry:
        """Launch on `stream` (no synchronisation); returns the launch's geometry."""
        key = (problem, tuple(sorted(pointers.items())), stream)
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepare(problem, pointers, stream)
            # scratch buffers may have been replaced while preparing: keep only launches made since
            if len(self._prepared) >= PREPARED_KEPT:
                self._prepared.pop(next(iter(self._prepared)))
            self._prepared[key] = prepared
        cu = _cu()
        g = prepared.geometry
        if prepared.config is not None:
            driver.check(cu.cuLaunchKernelEx(prepared.config, self.kernel.function,
                                             ctypes.addressof(prepared.params), 0))
        else:
            driver.check(cu.cuLaunchKernel(self.kernel.function, *g.grid, *g.block, g.shared_bytes, stream,
                                           ctypes.addressof(prepared.params), 0))
        return g

    def close(self) -> None:
        self._prepared.clear()
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
