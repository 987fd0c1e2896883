"""Rules of kernels/matrix/gemv.cuh: the decode GEMM (M <= 16) with split-K."""
from __future__ import annotations

from ..problem import Problem
from ..space import Realisation
from .base import (ACTIVATION_CONSTANTS, CTYPES, Geometry, GpuLimits, TemplateRules, aligned_leading_dimensions,
                   bool_literal)

MAX_M = 16                    # the rows of one m16n8k16 fragment
K_STEP = 32                   # K a warp covers per step (4 lanes x 8 elements)
MIN_SPLIT_STEPS = 8           # a split covers at least this many steps: the reduction stays a small share
RESIDENT_THREADS_PER_SM = 2048
REGISTERS_PER_SM = 65536
SHARED_BYTES_PER_SM = 228 * 1024   # Hopper's and Ampere's (A100) largest carve-out
ADDRESSING_REGISTERS = 40     # pointers, indices, predicates beside the loaded vectors (ptxas: 48-102 in all)


class GemvRules(TemplateRules):
    name = "gemv"

    def threads(self, real: Realisation) -> int:
        return 32 * real.knob("warps")

    def dynamic_shared_bytes(self, real: Realisation) -> int:
        """The warps' cp.async rings (ring > 0): ring groups of unroll x tiles 16-byte vectors a lane."""
        k = real.settings
        return k["warps"] * k["ring"] * k["unroll"] * k["tiles"] * 32 * 16

    def accumulators(self, real: Realisation) -> int:
        return 4 * real.knob("tiles")

    def registers_estimate(self, real: Realisation) -> int:
        """W's vectors (4 registers each, per tile and step) twice over where they come to registers
        (the group in use and the group in flight) and once from a ring, one step's two A vectors,
        the accumulators, and addressing. ptxas used fewer on every setting compiled (tiles 4,
        unroll 4: 192 estimated, 134 used)."""
        k = real.settings
        copies = 1 if k["ring"] else 2
        return copies * 4 * k["tiles"] * k["unroll"] + 8 + self.accumulators(real) + ADDRESSING_REGISTERS

    def violations(self, real: Realisation, limits: GpuLimits) -> list[str]:
        found = []
        if tuple(limits.compute_capability) < (8, 0):
            found.append(f"mma.sync with 16-bit operands needs compute capability 8.0, not {limits.compute_capability}")
        if self.registers_estimate(real) > limits.registers_per_thread:
            found.append(f"about {self.registers_estimate(real)} registers a thread "
                         f"(at most {limits.registers_per_thread})")
        if self.dynamic_shared_bytes(real) > limits.shared_optin_bytes:
            found.append(f"{self.dynamic_shared_bytes(real)} bytes of shared memory "
                         f"(the GPU allows {limits.shared_optin_bytes} a block)")
        return found

    def template_arguments(self, real: Realisation) -> list[str]:
        k, e = real.settings, real.epilogue
        found = [CTYPES[real.dtype], str(k["warps"]), str(k["tiles"]), str(k["unroll"]),
                 ACTIVATION_CONSTANTS[e.activation], bool_literal(e.bias), bool_literal(e.residual)]
        return found + ([str(k["ring"])] if k["ring"] else [])   # the template's default: registers

    def parameters(self, ctype: str) -> list[str]:
        return [f"const {ctype}* a", "int lda", f"const {ctype}* w", "int ldw", f"{ctype}* c", "int ldc",
                f"const {ctype}* bias", f"const {ctype}* residual", "int ldr", "int m", "int n", "int k",
                "int k_split", "float* partials", "unsigned* tickets"]

    def call_arguments(self) -> list[str]:
        return ["a", "lda", "w", "ldw", "c", "ldc", "bias", "residual", "ldr", "m", "n", "k", "k_split", "partials",
                "tickets"]

    arguments = (("pointer", "a"), ("int", "lda"), ("pointer", "b"), ("int", "ldb"), ("pointer", "c"), ("int", "ldc"),
                 ("pointer", "bias"), ("pointer", "residual"), ("int", "ldr"), ("int", "m"), ("int", "n"),
                 ("int", "k"), ("int", "k_split"), ("pointer", "workspace"), ("pointer", "tickets"))

    def unsupported(self, real: Realisation, problem: Problem) -> str | None:
        found = self.common_unsupported(real, problem)
        if found:
            return found
        if problem.m > MAX_M:
            return f"m = {problem.m}: the decode kernel takes at most {MAX_M} rows"
        if problem.k % 8:
            return f"k = {problem.k} is not a multiple of 8 (whole 16-byte vectors)"
        return aligned_leading_dimensions(problem)

    def columns_per_block(self, real: Realisation) -> int:
        return real.knob("warps") * real.knob("tiles") * 8

    def blocks_per_sm_estimate(self, real: Realisation) -> int:
        """CTAs an SM holds at once by the register estimate (a launch asks the driver instead)."""
        threads = self.threads(real)
        by_registers = REGISTERS_PER_SM // (self.registers_estimate(real) * threads)
        by_shared = SHARED_BYTES_PER_SM // max(1, self.dynamic_shared_bytes(real))
        return max(1, min(RESIDENT_THREADS_PER_SM // threads, by_registers, by_shared))

    def k_split(self, real: Realisation, problem: Problem, sm_count: int, blocks_per_sm: int | None = None) -> int:
        """K a split covers: as many splits as keep the grid within one wave of resident CTAs
        (a second, partial wave would run at a fraction of the bandwidth), each split at least
        MIN_SPLIT_STEPS steps, a whole number of steps."""
        blocks = -(-problem.n // self.columns_per_block(real))
        resident = sm_count * (blocks_per_sm or self.blocks_per_sm_estimate(real))
        steps = -(-problem.k // K_STEP)
        splits = max(1, min(resident // blocks, steps // MIN_SPLIT_STEPS))
        return -(-steps // splits) * K_STEP

    def geometry(self, real: Realisation, problem: Problem, sm_count: int, resident_clusters: int | None,
                 blocks_per_sm: int | None = None) -> Geometry:
        blocks = -(-problem.n // self.columns_per_block(real))
        k_split = self.k_split(real, problem, sm_count, blocks_per_sm)
        splits = -(-problem.k // k_split)
        workspace = splits * problem.m * problem.n * 4 if splits > 1 else 0
        return Geometry((blocks, splits, 1), (self.threads(real), 1, 1), 1, self.dynamic_shared_bytes(real), workspace,
                        4 * blocks, splits)
