"""Rules of kernels/matrix/gemm_wgmma.cuh: the sm_90a TMA + wgmma GEMM."""
from __future__ import annotations

from ..problem import Problem
from ..space import Realisation
from .base import (ACTIVATION_CONSTANTS, CTYPES, MAJOR_CONSTANTS, RASTER_CONSTANTS, Geometry, GpuLimits,
                   TemplateRules, aligned_leading_dimensions, bool_literal)

THREADS = 384                 # a producer warpgroup and two consumers
BLOCK_K = 64                  # one 128-byte swizzle row of 16-bit elements
RING_ALIGNMENT = 1024         # the ring is rounded up to a swizzle atom inside the dynamic allocation
STATIC_SHARED_ALLOWANCE = 256 # the full/empty barriers (16 bytes a stage), as ptxas rounds them
MAX_ACCUMULATORS = 128        # of the 232 registers a consumer thread gets


class WgmmaRules(TemplateRules):
    name = "wgmma"

    def threads(self, real: Realisation) -> int:
        return THREADS

    def min_blocks(self, real: Realisation) -> int:
        return 1   # setmaxnreg needs the register cap a launch bound of one block gives

    def dynamic_shared_bytes(self, real: Realisation) -> int:
        k = real.settings
        return k["stages"] * (k["block_m"] + k["block_n"]) * BLOCK_K * 2 + RING_ALIGNMENT

    def accumulators(self, real: Realisation) -> int:
        k = real.settings
        return (k["block_m"] // 2 // 64) * (k["block_n"] // 2)

    def violations(self, real: Realisation, limits: GpuLimits) -> list[str]:
        k, found = real.settings, []
        if tuple(limits.compute_capability) != (9, 0):
            found.append(f"sm_90a code runs on compute capability 9.0 only, not {limits.compute_capability}")
        if self.accumulators(real) > MAX_ACCUMULATORS:
            found.append(f"{self.accumulators(real)} accumulators a thread (at most {MAX_ACCUMULATORS})")
        shared = self.dynamic_shared_bytes(real) + STATIC_SHARED_ALLOWANCE
        if shared > limits.shared_optin_bytes:
            found.append(f"{shared} bytes of shared memory (the GPU allows {limits.shared_optin_bytes} a block)")
        if k["cluster_m"] > 1 and real.b_major == "mn" and (k["block_n"] // 64) % k["cluster_m"]:
            found.append(f"{k['block_n'] // 64} boxes of B do not split over {k['cluster_m']} CTAs")
        return found

    def template_arguments(self, real: Realisation) -> list[str]:
        k, e = real.settings, real.epilogue
        return [CTYPES[real.dtype], str(k["block_m"]), str(k["block_n"]), str(k["stages"]), str(k["cluster_m"]),
                MAJOR_CONSTANTS[real.a_major], MAJOR_CONSTANTS[real.b_major], RASTER_CONSTANTS[k["raster"]],
                str(k["group"]), ACTIVATION_CONSTANTS[e.activation], bool_literal(e.bias), bool_literal(e.residual)]

    def parameters(self, ctype: str) -> list[str]:
        return ["const __grid_constant__ aicg::matrix::TmaDescriptor a_map",
                "const __grid_constant__ aicg::matrix::TmaDescriptor b_map",
                f"{ctype}* c", "int ldc", f"const {ctype}* bias", f"const {ctype}* residual", "int ldr",
                "int m", "int n", "int k"]

    def call_arguments(self) -> list[str]:
        return ["&a_map", "&b_map", "c", "ldc", "bias", "residual", "ldr", "m", "n", "k"]

    # (kind, what): tensor maps of operands, pointers to buffers, problem integers
    arguments = (("tensor_map", "a"), ("tensor_map", "b"), ("pointer", "c"), ("int", "ldc"), ("pointer", "bias"),
                 ("pointer", "residual"), ("int", "ldr"), ("int", "m"), ("int", "n"), ("int", "k"))

    def unsupported(self, real: Realisation, problem: Problem) -> str | None:
        return self.common_unsupported(real, problem) or aligned_leading_dimensions(problem)

    def geometry(self, real: Realisation, problem: Problem, sm_count: int, resident_clusters: int | None) -> Geometry:
        k = real.settings
        cluster = k["cluster_m"]
        tiles_m = -(-problem.m // k["block_m"])
        cluster_tiles = -(-tiles_m // cluster) * -(-problem.n // k["block_n"])
        resident = (resident_clusters if cluster > 1 and resident_clusters else sm_count // cluster)
        clusters = max(1, min(resident, cluster_tiles))
        return Geometry((clusters * cluster, 1, 1), (THREADS, 1, 1), cluster, self.dynamic_shared_bytes(real))
