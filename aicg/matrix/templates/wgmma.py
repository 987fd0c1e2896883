"""Rules of kernels/matrix/gemm_wgmma.cuh: the sm_90a TMA + wgmma GEMM."""
from __future__ import annotations

from dataclasses import dataclass

from ..problem import Problem
from ..space import Realisation
from .base import (ACTIVATION_CONSTANTS, CTYPES, MAJOR_CONSTANTS, RASTER_CONSTANTS, Geometry, GpuLimits,
                   TemplateRules, aligned_leading_dimensions, bool_literal)

THREADS = 384                 # a producer warpgroup and two consumers
CONSUMERS = 2
BLOCK_K = 64                  # one 128-byte swizzle row of 16-bit elements
RING_ALIGNMENT = 1024         # the ring is rounded up to a swizzle atom inside the dynamic allocation
STATIC_SHARED_ALLOWANCE = 256 # the barriers (16 bytes a stage, 16 for the consumers' turns) and two flags
MAX_ACCUMULATORS = 128        # of the 232 registers a consumer thread gets
# A split-K launch keeps every unit's fp32 partial tile; past this much scratch memory a problem
# has tiles enough to fill the GPU without splitting K, and a realisation that splits is not for it.
MAX_WORKSPACE_BYTES = 1 << 30
SCHEDULE_CONSTANTS = {"cooperative": "aicg::matrix::SCHEDULE_COOPERATIVE",
                      "pingpong": "aicg::matrix::SCHEDULE_PINGPONG"}
STORE_CONSTANTS = {"direct": "aicg::matrix::STORE_DIRECT", "staged": "aicg::matrix::STORE_STAGED",
                   "handoff": "aicg::matrix::STORE_HANDOFF"}
HANDOFF_BARRIER_BYTES = 16    # a handed-off block's `filled` and `drained` barriers
# The kernel template's defaults for its last parameters (schedule, store, split_k, cluster_n): a
# realisation that keeps them is instantiated without them.
TRAILING_DEFAULTS = (("schedule", "cooperative"), ("store", "direct"), ("split_k", 1), ("cluster_n", 1))


@dataclass(frozen=True)
class Work:
    """A launch's units of work, as WgmmaWork in the header counts them."""
    tiles_m: int          # tile rows, padded to whole clusters along M
    tiles_n: int          # tile columns, padded to whole clusters along N
    k_blocks: int
    splits: int           # K ranges a tile is cut into (1: none)

    @property
    def tiles(self) -> int:
        return self.tiles_m * self.tiles_n

    @property
    def units(self) -> int:
        return self.tiles * self.splits


class WgmmaRules(TemplateRules):
    name = "wgmma"

    def threads(self, real: Realisation) -> int:
        return THREADS

    def cluster(self, real: Realisation) -> int:
        """CTAs a cluster: along M (sharing B) or along N (sharing A)."""
        k = real.settings
        return k["cluster_m"] * k["cluster_n"]

    def min_blocks(self, real: Realisation) -> int:
        return 1   # setmaxnreg needs the register cap a launch bound of one block gives

    def consumer_rows(self, real: Realisation) -> int:
        """Rows of a tile one consumer warpgroup computes: half the tile, or all of it in turns."""
        k = real.settings
        return k["block_m"] if k["schedule"] == "pingpong" else k["block_m"] // CONSUMERS

    def staging_bytes(self, real: Realisation) -> int:
        """Both consumers' staging buffers: a block of results, then the bias (STORE_STAGED); or a
        block of rounded sums and its two barriers (STORE_HANDOFF)."""
        k = real.settings
        block = self.consumer_rows(real) * k["block_n"] * 2
        if k["store"] == "staged":
            return CONSUMERS * (block + (k["block_n"] * 2 if real.epilogue.bias else 0))
        if k["store"] == "handoff":
            return CONSUMERS * (block + HANDOFF_BARRIER_BYTES)
        return 0

    def dynamic_shared_bytes(self, real: Realisation) -> int:
        k = real.settings
        return k["stages"] * (k["block_m"] + k["block_n"]) * BLOCK_K * 2 + RING_ALIGNMENT + self.staging_bytes(real)

    def rounds_sum(self, real: Realisation) -> bool:
        return real.knob("store") == "handoff"   # the consumers park their sums rounded to T

    def accumulators(self, real: Realisation) -> int:
        return (self.consumer_rows(real) // 64) * (real.knob("block_n") // 2)

    def violations(self, real: Realisation, limits: GpuLimits) -> list[str]:
        k, found = real.settings, []
        if tuple(limits.compute_capability) != (9, 0):
            found.append(f"sm_90a code runs on compute capability 9.0 only, not {limits.compute_capability}")
        if self.consumer_rows(real) % 64:
            found.append(f"{k['schedule']} consumers of {self.consumer_rows(real)} rows: a wgmma takes 64")
        elif self.accumulators(real) > MAX_ACCUMULATORS:
            found.append(f"{self.accumulators(real)} accumulators a thread (at most {MAX_ACCUMULATORS})")
        shared = self.dynamic_shared_bytes(real) + STATIC_SHARED_ALLOWANCE
        if shared > limits.shared_optin_bytes:
            found.append(f"{shared} bytes of shared memory (the GPU allows {limits.shared_optin_bytes} a block)")
        if k["cluster_m"] > 1 and real.b_major == "mn" and (k["block_n"] // 64) % k["cluster_m"]:
            found.append(f"{k['block_n'] // 64} boxes of B do not split over {k['cluster_m']} CTAs")
        if k["cluster_m"] > 1 and real.b_major == "k" and (k["block_n"] // k["cluster_m"]) % 8:
            found.append(f"{k['block_n'] // k['cluster_m']}-row shares of B are not whole 8-row swizzle groups")
        if k["cluster_m"] > 1 and k["cluster_n"] > 1:
            found.append("a cluster lies along M or along N, not both")
        if k["cluster_n"] > 1 and real.a_major == "mn" and (k["block_m"] // 64) % k["cluster_n"]:
            found.append(f"{k['block_m'] // 64} boxes of A do not split over {k['cluster_n']} CTAs")
        if k["cluster_n"] > 1 and real.a_major == "k" and (k["block_m"] // k["cluster_n"]) % 8:
            found.append(f"{k['block_m'] // k['cluster_n']}-row shares of A are not whole 8-row swizzle groups")
        if k["block_n"] % 64 and real.b_major == "mn":
            found.append(f"an MN-major B slice is boxes of 64 columns, not {k['block_n']}")
        if k["block_n"] % 64 and k["store"] in ("staged", "handoff"):
            found.append(f"a {k['store']} block's rows are whole 128-byte lines: {k['block_n']} columns are not")
        if k["store"] == "handoff" and (k["schedule"] != "cooperative" or k["split_k"] > 1):
            found.append("a handed-off epilogue follows the cooperative schedule's units, with K unsplit")
        return found

    def template_arguments(self, real: Realisation) -> list[str]:
        k, e = real.settings, real.epilogue
        found = [CTYPES[real.dtype], str(k["block_m"]), str(k["block_n"]), str(k["stages"]), str(k["cluster_m"]),
                 MAJOR_CONSTANTS[real.a_major], MAJOR_CONSTANTS[real.b_major], RASTER_CONSTANTS[k["raster"]],
                 str(k["group"]), ACTIVATION_CONSTANTS[e.activation], bool_literal(e.bias), bool_literal(e.residual)]
        trailing = [SCHEDULE_CONSTANTS[k["schedule"]], STORE_CONSTANTS[k["store"]], str(k["split_k"]),
                    str(k["cluster_n"])]
        kept = [k[name] == default for name, default in TRAILING_DEFAULTS]
        while kept and kept[-1]:
            kept.pop()
        return found + trailing[:len(kept)]

    def parameters(self, ctype: str) -> list[str]:
        return ["const __grid_constant__ aicg::matrix::TmaDescriptor a_map",
                "const __grid_constant__ aicg::matrix::TmaDescriptor b_map",
                f"{ctype}* c", "int ldc", f"const {ctype}* bias", f"const {ctype}* residual", "int ldr",
                "int m", "int n", "int k", "float* workspace", "unsigned* tickets"]

    def call_arguments(self) -> list[str]:
        return ["&a_map", "&b_map", "c", "ldc", "bias", "residual", "ldr", "m", "n", "k", "workspace", "tickets"]

    # (kind, what): tensor maps of operands, pointers to buffers, problem integers
    arguments = (("tensor_map", "a"), ("tensor_map", "b"), ("pointer", "c"), ("int", "ldc"), ("pointer", "bias"),
                 ("pointer", "residual"), ("int", "ldr"), ("int", "m"), ("int", "n"), ("int", "k"),
                 ("pointer", "workspace"), ("pointer", "tickets"))

    def work(self, real: Realisation, problem: Problem) -> Work:
        """The units a launch walks: WgmmaWork's arithmetic (tiles padded to whole clusters, K cut
        into at most split_k parts of whole 64-wide slices, none empty)."""
        k = real.settings
        along_m, along_n = k["cluster_m"], k["cluster_n"]
        tiles_m = -(-(-(-problem.m // k["block_m"])) // along_m) * along_m
        tiles_n = -(-(-(-problem.n // k["block_n"])) // along_n) * along_n
        k_blocks = -(-problem.k // BLOCK_K)
        parts = min(k["split_k"], k_blocks)
        per_split = -(-k_blocks // parts)
        return Work(tiles_m, tiles_n, k_blocks, -(-k_blocks // per_split))

    def workspace_bytes(self, real: Realisation, problem: Problem) -> int:
        w = self.work(real, problem)
        return w.units * real.knob("block_m") * real.knob("block_n") * 4 if w.splits > 1 else 0

    def unsupported(self, real: Realisation, problem: Problem) -> str | None:
        found = self.common_unsupported(real, problem) or aligned_leading_dimensions(problem)
        if found is None and self.workspace_bytes(real, problem) > MAX_WORKSPACE_BYTES:
            found = (f"split into {self.work(real, problem).splits} parts, {problem.name} needs "
                     f"{self.workspace_bytes(real, problem) / 2**20:.0f} MiB of partial sums (at most "
                     f"{MAX_WORKSPACE_BYTES // 2**20}): its tiles fill the GPU without splitting K")
        return found

    def geometry(self, real: Realisation, problem: Problem, sm_count: int, resident_clusters: int | None,
                 blocks_per_sm: int | None = None) -> Geometry:
        cluster = self.cluster(real)
        w = self.work(real, problem)
        cluster_units = w.units // cluster
        resident = (resident_clusters if cluster > 1 and resident_clusters else sm_count // cluster)
        clusters = max(1, min(resident, cluster_units))
        tickets = 4 * w.tiles if w.splits > 1 else 0
        return Geometry((clusters * cluster, 1, 1), (THREADS, 1, 1), cluster, self.dynamic_shared_bytes(real),
                        self.workspace_bytes(real, problem), tickets, w.splits)
