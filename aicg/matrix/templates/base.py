"""What every matrix template tells the rest of aicg about itself.

A template's rules turn a realisation into: the template arguments and entry
signature that codegen writes, the threads and shared memory a launch needs,
the constraints that rule a realisation out on a GPU, the problems it can
take (alignment, shapes), and the launch of one problem (grid, cluster,
arguments, scratch memory).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..problem import Problem
from ..space import Realisation

CTYPES = {"bfloat16": "aicg::bf16", "float16": "aicg::f16"}
ACTIVATION_CONSTANTS = {"none": "aicg::matrix::ACT_NONE", "gelu_tanh": "aicg::matrix::ACT_GELU_TANH",
                        "gelu_erf": "aicg::matrix::ACT_GELU_ERF", "silu": "aicg::matrix::ACT_SILU"}
MAJOR_CONSTANTS = {"k": "aicg::matrix::K_MAJOR", "mn": "aicg::matrix::MN_MAJOR"}
RASTER_CONSTANTS = {"m": "aicg::matrix::RASTER_M", "n": "aicg::matrix::RASTER_N"}
ELEMENT_BYTES = 2
VECTOR_BYTES = 16      # cp.async chunks and the copy engine's stride unit


@dataclass(frozen=True)
class GpuLimits:
    """The facts the constraints read: from a hwdb entry (planning, CI) or from the device (a run)."""
    compute_capability: tuple[int, int]
    shared_optin_bytes: int          # dynamic + static shared memory a block may have after opting in
    registers_per_thread: int
    sm_count: int

    @staticmethod
    def of_hardware(hardware) -> "GpuLimits":
        return GpuLimits(tuple(hardware.compute_capability), int(hardware.fact("shared_memory_per_block_optin")),
                         int(hardware.fact("max_registers_per_thread")), int(hardware.fact("sm_count")))


@dataclass(frozen=True)
class Geometry:
    """One launch: grid and block (x, y, z), cluster size along x (1: none), dynamic shared
    memory, the scratch memory the kernel needs (bytes; tickets must start zeroed), and the
    parts each output's K sum is cut into (split-K: one more float addition per part, which
    the error bound counts)."""
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: int
    shared_bytes: int
    workspace_bytes: int = 0
    ticket_bytes: int = 0
    splits: int = 1


class TemplateRules:
    name: str = ""
    static_shared_bytes = 0   # besides the dynamic ring; what ptxas reports as smem

    def arch(self, compute_capability: tuple[int, int]) -> str:
        """The NVRTC target for a GPU of this compute capability."""
        major, minor = compute_capability
        return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"

    def threads(self, real: Realisation) -> int:
        raise NotImplementedError

    def min_blocks(self, real: Realisation) -> int | None:
        """The second __launch_bounds__ argument, where the template needs one."""
        return None

    def cluster(self, real: Realisation) -> int:
        """CTAs a thread-block cluster of the realisation holds (1: not clustered)."""
        return 1

    def dynamic_shared_bytes(self, real: Realisation) -> int:
        raise NotImplementedError

    def rounds_sum(self, real: Realisation) -> bool:
        """Whether the realisation rounds each sum to the output type before its epilogue (one rounding
        more in the error bound: aicg/matrix/reference.py)."""
        return False

    def accumulators(self, real: Realisation) -> int:
        """fp32 accumulators a thread holds."""
        raise NotImplementedError

    def violations(self, real: Realisation, limits: GpuLimits) -> list[str]:
        """Why `real` cannot run on a GPU with these limits (empty: it can)."""
        raise NotImplementedError

    def template_arguments(self, real: Realisation) -> list[str]:
        raise NotImplementedError

    def parameters(self, ctype: str) -> list[str]:
        """The extern "C" entry's parameters, declarations in order."""
        raise NotImplementedError

    def call_arguments(self) -> list[str]:
        """What the entry passes to the template function."""
        raise NotImplementedError

    def unsupported(self, real: Realisation, problem: Problem) -> str | None:
        """Why `real` cannot compute `problem` (its shape or layout), None where it can. Pointer
        alignment is checked at launch."""
        raise NotImplementedError

    def geometry(self, real: Realisation, problem: Problem, sm_count: int, resident_clusters: int | None,
                 blocks_per_sm: int | None = None) -> Geometry:
        """The launch of `problem`: `resident_clusters` is how many of a clustered realisation's
        clusters the GPU holds at once, `blocks_per_sm` how many of its CTAs an SM holds (the
        driver's occupancy; None: the template's own estimate)."""
        raise NotImplementedError

    def operand_alignment(self, real: Realisation) -> int:
        """Bytes A's and B's base addresses must be multiples of (C, bias and residual: an element)."""
        return VECTOR_BYTES

    def common_unsupported(self, real: Realisation, problem: Problem) -> str | None:
        if (real.dtype, real.a_major, real.b_major, real.epilogue) != \
                (problem.dtype, problem.a_major, problem.b_major, problem.epilogue):
            return (f"built for {real.dtype} {real.a_major}{real.b_major} {real.epilogue.name}, "
                    f"asked for {problem.dtype} {problem.a_major}{problem.b_major} {problem.epilogue.name}")
        return None


def aligned_leading_dimensions(problem: Problem, names=("lda", "ldb")) -> str | None:
    """None where every named leading dimension is a whole number of 16-byte vectors."""
    per_vector = VECTOR_BYTES // ELEMENT_BYTES
    for name in names:
        value = getattr(problem, name)
        if value % per_vector:
            return f"{name} = {value} is not a multiple of {per_vector} elements (16 bytes)"
    return None


def bool_literal(value: bool) -> str:
    return "true" if value else "false"
