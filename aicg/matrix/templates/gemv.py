"""Rules of kernels/matrix/gemv.cuh: the decode GEMM (M <= 16), its work spread over the GPU by
split-K (spread "splits"), in equal shares of (column block, K step) units (spread "even"), among a
CTA's warps (spread "warps"), or in runs of column blocks a CTA streamed by bulk copies through a
ring of shared-memory stages (spread "bulk", sm_90)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..problem import Problem
from ..space import Realisation
from .base import (ACTIVATION_CONSTANTS, CTYPES, Geometry, GpuLimits, TemplateRules, aligned_leading_dimensions,
                   bool_literal)

MAX_M = 16                    # the rows of one m16n8k16 fragment
K_STEP = 32                   # K a warp covers per step (4 lanes x 8 elements): gemv.cuh's GEMV_K_STEP
SPREAD_CONSTANTS = {"splits": "aicg::matrix::SPREAD_SPLITS", "even": "aicg::matrix::SPREAD_EVEN",
                    "warps": "aicg::matrix::SPREAD_WARPS", "bulk": "aicg::matrix::SPREAD_BULK"}
BULK_COMPUTE_CAPABILITY = (9, 0)   # cp.async.bulk and mbarrier transaction counts
BULK_ROW_PAD = 32             # elements a stage's row holds past its K: gemv.cuh's BulkStage PITCH
BULK_BARRIER_BYTES = 16       # a stage's two mbarriers
EVEN_SLOTS = 2                # partial segments a CTA of the even spread may publish: its first and last block
INT_LIMIT = 2 ** 31           # the kernel cuts shares in int arithmetic
MIN_SPLIT_STEPS = 8           # a split covers at least this many steps: the reduction stays a small share
RESIDENT_THREADS_PER_SM = 2048
REGISTERS_PER_SM = 65536
SHARED_BYTES_PER_SM = 228 * 1024   # Hopper's and Ampere's (A100) largest carve-out
ADDRESSING_REGISTERS = 40     # pointers, indices, predicates beside the loaded vectors (ptxas: 48-102 in all)
WALK_REGISTERS = 8            # the even spread's segment walk besides (ptxas: up to 4 more than 40 + 8 held)
BULK_ADDRESSING_REGISTERS = 48   # the bulk spread's: stage and barrier addresses, the run's bounds (ptxas: 72-109 in all)


class GemvRules(TemplateRules):
    name = "gemv"

    def threads(self, real: Realisation) -> int:
        """The warps; the bulk spread's producer warp besides."""
        return 32 * (real.knob("warps") + (real.knob("spread") == "bulk"))

    def min_blocks(self, real: Realisation) -> int | None:
        """For the even spread with a ring, the CTAs the ring's shared memory lets an SM hold: told
        nothing, ptxas aims at more CTAs (48 registers for 8 warps) and spills a few values the
        segment walk keeps across its K loop; where the ring bounds the occupancy anyway, the
        registers it would save buy nothing."""
        k = real.settings
        if k["spread"] != "even" or not k["ring"]:
            return None
        return max(1, SHARED_BYTES_PER_SM // self.dynamic_shared_bytes(real))

    def dynamic_shared_bytes(self, real: Realisation) -> int:
        """The warps' cp.async rings (ring > 0): ring groups of unroll x tiles 16-byte vectors a lane;
        the bulk spread's ring of `ring` stages."""
        k = real.settings
        if k["spread"] == "bulk":
            return k["ring"] * self.bulk_stage_bytes(real)
        return k["warps"] * k["ring"] * k["unroll"] * k["tiles"] * 32 * 16

    def bulk_stage_bytes(self, real: Realisation) -> int:
        """A bulk stage: tiles x 8 rows of W, warps x unroll steps of K each, rows padded (BulkStage)."""
        k = real.settings
        return k["tiles"] * 8 * (k["warps"] * k["unroll"] * K_STEP + BULK_ROW_PAD) * 2

    def runs_shared_bytes(self, real: Realisation) -> int:
        """The warps and bulk spreads' sums of every warp but the first, 4 floats a lane and tile, in
        static shared memory (and the bulk ring's barriers)."""
        k = real.settings
        if k["spread"] == "bulk":
            return max(1, k["warps"] - 1) * k["tiles"] * 32 * 16 + k["ring"] * BULK_BARRIER_BYTES
        return (k["warps"] - 1) * k["tiles"] * 32 * 16 if k["spread"] == "warps" else 0

    def block_shared_bytes(self, real: Realisation) -> int:
        """A CTA's shared memory: the rings (dynamic) and the warps' sums (static)."""
        return self.dynamic_shared_bytes(real) + self.runs_shared_bytes(real)

    def accumulators(self, real: Realisation) -> int:
        return 4 * real.knob("tiles")

    def registers_estimate(self, real: Realisation) -> int:
        """W's vectors (4 registers each, per tile and step) twice over where they come to registers
        (the group in use and the group in flight) and once from a ring, one step's two A vectors,
        the accumulators, addressing, and the even spread's walk. ptxas used fewer on every setting
        compiled (tiles 4, unroll 4: 192 estimated, 134 used)."""
        k = real.settings
        if k["spread"] == "bulk":   # a chunk's A vectors held across the wait, one step of W
            return 2 * 4 * k["unroll"] + 4 * k["tiles"] + self.accumulators(real) + BULK_ADDRESSING_REGISTERS
        copies = 1 if k["ring"] else 2
        walk = WALK_REGISTERS if k["spread"] == "even" else 0
        return copies * 4 * k["tiles"] * k["unroll"] + 8 + self.accumulators(real) + ADDRESSING_REGISTERS + walk

    def violations(self, real: Realisation, limits: GpuLimits) -> list[str]:
        found = []
        if tuple(limits.compute_capability) < (8, 0):
            found.append(f"mma.sync with 16-bit operands needs compute capability 8.0, not {limits.compute_capability}")
        if real.knob("spread") == "bulk":
            if tuple(limits.compute_capability) < BULK_COMPUTE_CAPABILITY:
                found.append(f"the bulk spread's copies need compute capability 9.0, not {limits.compute_capability}")
            if real.knob("ring") < 2:
                found.append(f"ring = {real.knob('ring')}: the bulk spread reads one stage while the next lands")
        if self.registers_estimate(real) > limits.registers_per_thread:
            found.append(f"about {self.registers_estimate(real)} registers a thread "
                         f"(at most {limits.registers_per_thread})")
        shared = self.block_shared_bytes(real)
        if shared > limits.shared_optin_bytes:
            found.append(f"{shared} bytes of shared memory (the GPU allows {limits.shared_optin_bytes} a block)")
        return found

    def template_arguments(self, real: Realisation) -> list[str]:
        k, e = real.settings, real.epilogue
        found = [CTYPES[real.dtype], str(k["warps"]), str(k["tiles"]), str(k["unroll"]),
                 ACTIVATION_CONSTANTS[e.activation], bool_literal(e.bias), bool_literal(e.residual)]
        # the template's defaults: registers, split-K
        if k["spread"] != "splits":
            return found + [str(k["ring"]), SPREAD_CONSTANTS[k["spread"]]]
        return found + ([str(k["ring"])] if k["ring"] else [])

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
        blocks = -(-problem.n // self.columns_per_block(real))
        units = blocks * -(-problem.k // K_STEP)
        if real.knob("spread") == "even" and units >= INT_LIMIT:
            return f"{units} units of work: the even spread counts them in a 32-bit int"
        if real.knob("spread") == "bulk" and blocks * blocks >= INT_LIMIT:
            return f"{blocks} column blocks: the bulk spread cuts them among CTAs in a 32-bit int"
        return aligned_leading_dimensions(problem)

    def columns_per_block(self, real: Realisation) -> int:
        """Output columns a column block holds: a warp's (tiles x 8) in the warps spread, whose warps
        share their block's columns, else every warp's."""
        if real.knob("spread") in ("warps", "bulk"):
            return real.knob("tiles") * 8
        return real.knob("warps") * real.knob("tiles") * 8

    def blocks_per_sm_estimate(self, real: Realisation) -> int:
        """CTAs an SM holds at once by the register estimate (a launch asks the driver instead)."""
        threads = self.threads(real)
        by_registers = REGISTERS_PER_SM // (self.registers_estimate(real) * threads)
        by_shared = SHARED_BYTES_PER_SM // max(1, self.block_shared_bytes(real))
        return max(1, min(RESIDENT_THREADS_PER_SM // threads, by_registers, by_shared))

    def resident_ctas(self, real: Realisation, sm_count: int, blocks_per_sm: int | None = None) -> int:
        """CTAs one wave holds: the driver's occupancy where a launch asked it, else the estimate."""
        return sm_count * (blocks_per_sm or self.blocks_per_sm_estimate(real))

    def k_split(self, real: Realisation, problem: Problem, sm_count: int, blocks_per_sm: int | None = None) -> int:
        """K a split covers: as many splits as keep the grid within one wave of resident CTAs
        (a second, partial wave would run at a fraction of the bandwidth), each split at least
        MIN_SPLIT_STEPS steps, a whole number of steps. The even and warps spreads read no split: 0."""
        if real.knob("spread") != "splits":
            return 0
        blocks = -(-problem.n // self.columns_per_block(real))
        resident = self.resident_ctas(real, sm_count, blocks_per_sm)
        steps = -(-problem.k // K_STEP)
        splits = max(1, min(resident // blocks, steps // MIN_SPLIT_STEPS))
        return -(-steps // splits) * K_STEP

    def even_shares(self, real: Realisation, problem: Problem, sm_count: int,
                    blocks_per_sm: int | None = None) -> "EvenShares":
        """The even spread's cut of `problem`: one share for each CTA one wave holds, no more CTAs than
        there are units."""
        blocks = -(-problem.n // self.columns_per_block(real))
        steps = -(-problem.k // K_STEP)
        return EvenShares(blocks, steps, min(self.resident_ctas(real, sm_count, blocks_per_sm), blocks * steps))

    def geometry(self, real: Realisation, problem: Problem, sm_count: int, resident_clusters: int | None,
                 blocks_per_sm: int | None = None) -> Geometry:
        threads, shared = (self.threads(real), 1, 1), self.dynamic_shared_bytes(real)
        if real.knob("spread") in ("warps", "bulk"):
            # a block's K sum in as many parts as warps hold steps of it, added in the CTA; the warps
            # spread a CTA a block, the bulk spread a run of whole blocks, at most one wave of CTAs
            blocks, steps = -(-problem.n // self.columns_per_block(real)), -(-problem.k // K_STEP)
            ctas = min(blocks, self.resident_ctas(real, sm_count, blocks_per_sm)) \
                if real.knob("spread") == "bulk" else blocks
            return Geometry((ctas, 1, 1), threads, 1, shared, 0, 0, min(real.knob("warps"), steps))
        if real.knob("spread") == "even":
            shares = self.even_shares(real, problem, sm_count, blocks_per_sm)
            if shares.most_parts == 1:       # every block one CTA's whole: no partial sums, no tickets
                return Geometry((shares.ctas, 1, 1), threads, 1, shared, 0, 0, 1)
            workspace = shares.ctas * EVEN_SLOTS * problem.m * self.columns_per_block(real) * 4
            return Geometry((shares.ctas, 1, 1), threads, 1, shared, workspace, 4 * shares.blocks,
                            shares.most_parts)
        blocks = -(-problem.n // self.columns_per_block(real))
        k_split = self.k_split(real, problem, sm_count, blocks_per_sm)
        splits = -(-problem.k // k_split)
        workspace = splits * problem.m * problem.n * 4 if splits > 1 else 0
        return Geometry((blocks, splits, 1), threads, 1, shared, workspace, 4 * blocks, splits)


@dataclass(frozen=True)
class EvenShares:
    """The even spread's work: `blocks` column blocks of `steps` K steps each, the units (block, step)
    taken block-major and cut into `ctas` contiguous shares, share p = [p U / P, (p + 1) U / P) for U
    units and P CTAs (lengths differ by at most one step). A share walks as segments of one block each.
    What gemv.cuh's EvenShares and its walk compute, so that the host can size the workspace and bound
    the parts of a sum; `walk` follows the kernel's own steps, which the tests hold to the plain
    definitions (`segments`, `covering`, `slot`)."""
    blocks: int
    steps: int
    ctas: int

    def __post_init__(self):
        if not 1 <= self.ctas <= self.units:
            raise ValueError(f"{self.ctas} CTAs for {self.units} units: expected 1 to {self.units}")
        if self.units >= INT_LIMIT or self.ctas ** 2 >= INT_LIMIT:
            raise ValueError(f"{self.units} units over {self.ctas} CTAs: the kernel's int arithmetic takes fewer "
                             f"than 2^31 units and 46340 CTAs")

    @property
    def units(self) -> int:
        return self.blocks * self.steps

    def begin(self, cta: int) -> int:
        return cta * self.units // self.ctas     # the kernel: cta per_cta + cta extra / ctas, equal

    def owner(self, unit: int) -> int:
        """The CTA whose share holds `unit`: the largest p with begin(p) <= unit."""
        return ((unit + 1) * self.ctas - 1) // self.units

    def covering(self, block: int) -> range:
        """The CTAs that sum part of `block`, in K order."""
        return range(self.owner(block * self.steps), self.owner((block + 1) * self.steps - 1) + 1)

    def slot(self, cta: int, block: int) -> int:
        """Where `cta` publishes its part of `block`: 0 for the first block of its share, 1 for the last."""
        return 0 if self.begin(cta) // self.steps == block else 1

    def segments(self, cta: int) -> list[tuple[int, int, int]]:
        """The (block, first step, end step) segments `cta` sums, in the order it walks them."""
        found, unit, end = [], self.begin(cta), self.begin(cta + 1)
        while unit < end:
            block = unit // self.steps
            segment_end = min(end, (block + 1) * self.steps)
            found.append((block, unit - block * self.steps, segment_end - block * self.steps))
            unit = segment_end
        return found

    def walk(self, cta: int) -> list[tuple[int, int, int, int, int, int]]:
        """(block, first step, end step, first CTA, last CTA, first CTA's slot) for each segment of
        `cta`, as the kernel finds them: the covering CTAs of its share's first and last blocks only
        (the blocks between are its own), and the slot of a block's first CTA."""
        begin, end = self.begin(cta), self.begin(cta + 1)
        first_block, last_block = begin // self.steps, (end - 1) // self.steps
        first_of_first = self.owner(first_block * self.steps)
        last_of_last = self.owner((last_block + 1) * self.steps - 1)
        slot_of_first = 1 if self.begin(first_of_first) < first_block * self.steps else 0
        found = []
        for block in range(first_block, last_block + 1):
            block_begin = block * self.steps
            found.append((block, begin - block_begin if block == first_block else 0,
                          end - block_begin if block == last_block else self.steps,
                          first_of_first if block == first_block else cta,
                          last_of_last if block == last_block else cta,
                          slot_of_first if block == first_block else 1))
        return found

    @cached_property
    def parts(self) -> np.ndarray:
        """The CTAs that cover each block (1: a CTA sums it whole and stores it directly)."""
        first = np.arange(self.blocks, dtype=np.int64) * self.steps
        return ((first + self.steps) * self.ctas - 1) // self.units - ((first + 1) * self.ctas - 1) // self.units + 1

    @property
    def most_parts(self) -> int:
        return int(self.parts.max())

    @property
    def partial_segments(self) -> int:
        """Segments published to the workspace: those of every block more than one CTA covers."""
        return int(self.parts[self.parts > 1].sum())
