"""Rules of kernels/matrix/gemm_mma.cuh: the sm_80+ cp.async + mma.sync GEMM."""
from __future__ import annotations

from ..problem import Problem
from ..space import Realisation
from .base import (ACTIVATION_CONSTANTS, CTYPES, MAJOR_CONSTANTS, RASTER_CONSTANTS, Geometry, GpuLimits,
                   TemplateRules, aligned_leading_dimensions, bool_literal)

PAD = 8                      # elements after each shared-memory row (kernels: MmaTile::PAD)
MAX_ACCUMULATORS = 128
MAX_THREADS = 1024


class MmaRules(TemplateRules):
    name = "mma"

    def threads(self, real: Realisation) -> int:
        return 32 * real.knob("warps_m") * real.knob("warps_n")

    def dynamic_shared_bytes(self, real: Realisation) -> int:
        k = real.settings
        a = k["block_m"] * (k["block_k"] + PAD) if real.a_major == "k" else k["block_k"] * (k["block_m"] + PAD)
        b = k["block_n"] * (k["block_k"] + PAD) if real.b_major == "k" else k["block_k"] * (k["block_n"] + PAD)
        return k["stages"] * 2 * (a + b)

    def accumulators(self, real: Realisation) -> int:
        k = real.settings
        return (k["block_m"] // k["warps_m"] // 16) * (k["block_n"] // k["warps_n"] // 8) * 4

    def violations(self, real: Realisation, limits: GpuLimits) -> list[str]:
        k, found = real.settings, []
        if tuple(limits.compute_capability) < (8, 0):
            found.append(f"mma.sync with 16-bit operands and cp.async need compute capability 8.0, "
                         f"not {limits.compute_capability}")
        if k["block_m"] % (16 * k["warps_m"]) or k["block_n"] % (16 * k["warps_n"]):
            found.append(f"a {k['block_m']} x {k['block_n']} tile is not whole 16 x 16 pieces for "
                         f"{k['warps_m']} x {k['warps_n']} warps")
        elif self.accumulators(real) > MAX_ACCUMULATORS:
            found.append(f"{self.accumulators(real)} accumulators a thread (at most {MAX_ACCUMULATORS})")
        if self.threads(real) > MAX_THREADS:
            found.append(f"{self.threads(real)} threads a block (at most {MAX_THREADS})")
        if self.dynamic_shared_bytes(real) > limits.shared_optin_bytes:
            found.append(f"{self.dynamic_shared_bytes(real)} bytes of shared memory "
                         f"(the GPU allows {limits.shared_optin_bytes} a block)")
        return found

    def template_arguments(self, real: Realisation) -> list[str]:
        k, e = real.settings, real.epilogue
        return [CTYPES[real.dtype], str(k["block_m"]), str(k["block_n"]), str(k["block_k"]), str(k["warps_m"]),
                str(k["warps_n"]), str(k["stages"]), MAJOR_CONSTANTS[real.a_major], MAJOR_CONSTANTS[real.b_major],
                bool_literal(k["aligned"]), RASTER_CONSTANTS[k["raster"]], str(k["group"]),
                ACTIVATION_CONSTANTS[e.activation], bool_literal(e.bias), bool_literal(e.residual)]

    def parameters(self, ctype: str) -> list[str]:
        return [f"const {ctype}* a", "int lda", f"const {ctype}* b", "int ldb", f"{ctype}* c", "int ldc",
                f"const {ctype}* bias", f"const {ctype}* residual", "int ldr", "int m", "int n", "int k"]

    def call_arguments(self) -> list[str]:
        return ["a", "lda", "b", "ldb", "c", "ldc", "bias", "residual", "ldr", "m", "n", "k"]

    arguments = (("pointer", "a"), ("int", "lda"), ("pointer", "b"), ("int", "ldb"), ("pointer", "c"), ("int", "ldc"),
                 ("pointer", "bias"), ("pointer", "residual"), ("int", "ldr"), ("int", "m"), ("int", "n"),
                 ("int", "k"))

    def unsupported(self, real: Realisation, problem: Problem) -> str | None:
        found = self.common_unsupported(real, problem)
        if found is None and real.knob("aligned"):
            found = aligned_leading_dimensions(problem)
        return found

    def operand_alignment(self, real: Realisation) -> int:
        return 16 if real.knob("aligned") else 2

    def geometry(self, real: Realisation, problem: Problem, sm_count: int, resident_clusters: int | None,
                 blocks_per_sm: int | None = None) -> Geometry:
        k = real.settings
        tiles = -(-problem.m // k["block_m"]) * -(-problem.n // k["block_n"])
        return Geometry((tiles, 1, 1), (self.threads(real), 1, 1), 1, self.dynamic_shared_bytes(real))
