"""Tensor-core throughput: warp-level mma.sync by input type, and Hopper's warpgroup wgmma.

mma.sync (kernels/probes/mma.cu): bf16 and fp16 m16n8k16, tf32 m16n8k8 and,
from compute capability 8.9, fp8 e4m3 m16n8k32, all accumulating in f32.
Every warp holds fragments of random operands (uploaded from numpy; never
zeros, never NaN) and issues CHAINS independent MMAs per iteration, one per
accumulator set, so the tensor cores always have work while each result is
in flight. One, two or four 256-thread blocks run on every SM (8 to 32
warps); the figure is the best of those occupancies, and the curve shows
how many warps per SM the tensor cores need.

wgmma (kernels/probes/wgmma.cu, compiled for sm_90a, run on compute
capability 9.0 only): m64n256k16 bf16 and m64n256k32 fp8 e4m3, both
operands read from shared memory through matrix descriptors, a 64x256 f32
accumulator in each warpgroup's registers; each iteration issues
WGMMAS_PER_GROUP MMAs as one commit group and waits with one group still
pending, so a group is always queued. One to three warpgroups (blocks) per
SM; the figure is the best.

Figures are `<instruction>_flops`: 2 x M x N x K FLOPs per instruction,
over event time. The MMAs are
volatile asm, and every accumulator is summed into a per-thread sink word
after the loop, so none is removed or merged.

On sm_90, ptxas lowers mma.sync with e4m3 inputs to a conversion and two
f16 MMAs (Hopper runs fp8 natively only in wgmma), so `mma_sync_fp8_flops`
there is the rate of that emulation, with the conversion hoisted out of the
loop because the operands never change.

Read by the planner: the matrix prior (aicg/matrix/prior.py) takes
`wgmma_bf16_flops` (and `wgmma_fp16_flops` where measured) as the wgmma
template's compute ceiling and `mma_sync_bf16_flops` / `mma_sync_fp16_flops`
as mma.sync's, in place of the datasheet's bf16_tensor_flops; the report
sets each matrix case against `wgmma_bf16_flops`.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from ..runtime import driver
from .figures import Curve, ProbeResult, figure

NAME = "tensor_cores"
SOURCES = (("mma.cu", ("sm_80", "sm_90")), ("wgmma.cu", ("sm_90a",)))
FIGURES = {"mma_sync_bf16_flops": "FLOP/s", "mma_sync_fp16_flops": "FLOP/s", "mma_sync_tf32_flops": "FLOP/s",
           "mma_sync_fp8_flops": "FLOP/s", "wgmma_bf16_flops": "FLOP/s", "wgmma_fp8_flops": "FLOP/s"}

CHAINS, MMA_BLOCK = 8, 256           # as in mma.cu
MMA_BLOCKS_PER_SM = (1, 2, 4)        # 8, 16, 32 warps per SM (mma.cu's launch bounds allow four)
WARPGROUP, WGMMAS_PER_GROUP = 128, 4  # as in wgmma.cu
WARPGROUPS_PER_SM = (1, 2, 3)        # as many as registers allow (wgmma.cu: 128 accumulators a thread)
OPERAND_BYTES = 1 << 20              # mma.cu reads the first 256 KiB, wgmma.cu all of it
TARGET_MS = 2.0                      # a timed launch at the highest occupancy
CALIBRATION_ITERATIONS = 64
REPETITIONS, LAUNCHES = 7, 3
SEED = 20240917


@dataclass(frozen=True)
class Instruction:
    name: str            # the figure is f"{name}_flops"
    file: str
    entry: str
    operands: str        # the encoding of its random operands (random_operands)
    shape: tuple[int, int, int]
    arch: str | None = None         # None: the device's own
    min_capability: tuple[int, int] = (8, 0)
    max_capability: tuple[int, int] = (99, 99)

    @property
    def flops(self) -> int:
        m, n, k = self.shape
        return 2 * m * n * k

    @property
    def warpgroup(self) -> bool:
        return self.file == "wgmma.cu"


INSTRUCTIONS = (
    Instruction("mma_sync_bf16", "mma.cu", "mma_bf16", "bf16", (16, 8, 16)),
    Instruction("mma_sync_fp16", "mma.cu", "mma_fp16", "fp16", (16, 8, 16)),
    Instruction("mma_sync_tf32", "mma.cu", "mma_tf32", "tf32", (16, 8, 8)),
    Instruction("mma_sync_fp8", "mma.cu", "mma_fp8_e4m3", "e4m3", (16, 8, 32), min_capability=(8, 9)),
    Instruction("wgmma_bf16", "wgmma.cu", "wgmma_bf16", "bf16", (64, 256, 16), "sm_90a", (9, 0), (9, 0)),
    Instruction("wgmma_fp8", "wgmma.cu", "wgmma_fp8_e4m3", "e4m3", (64, 256, 32), "sm_90a", (9, 0), (9, 0)),
)


def random_operands(encoding: str, nbytes: int, seed: int = SEED) -> np.ndarray:
    """`nbytes` of random finite, non-zero operands in [-2, 2] of one input type, as uint32 words."""
    rng = np.random.default_rng(seed)
    count = nbytes // 4
    if encoding == "tf32":                   # f32 bits; the tensor core ignores the low 13 mantissa bits
        values = rng.uniform(0.25, 2.0, count) * rng.choice((-1.0, 1.0), count)
        return values.astype(np.float32).view(np.uint32)
    if encoding == "bf16":                   # the high half of an f32
        values = (rng.uniform(0.25, 2.0, 2 * count) * rng.choice((-1.0, 1.0), 2 * count)).astype(np.float32)
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint32)
    if encoding == "fp16":
        values = rng.uniform(0.25, 2.0, 2 * count) * rng.choice((-1.0, 1.0), 2 * count)
        return values.astype(np.float16).view(np.uint32)
    if encoding == "e4m3":                   # sign, 4-bit exponent (bias 7), 3-bit mantissa
        sign = rng.integers(0, 2, 4 * count, dtype=np.uint8) << 7
        exponent = rng.integers(5, 8, 4 * count, dtype=np.uint8) << 3     # 0.25 .. 1.875: never 0 or NaN
        mantissa = rng.integers(0, 8, 4 * count, dtype=np.uint8)
        return (sign | exponent | mantissa).view(np.uint32)
    raise ValueError(f"unknown operand encoding {encoding!r}")


def flops_per_launch(instruction: Instruction, grid: int, iterations: int) -> int:
    """FLOPs one launch performs: per warp (mma.sync, CHAINS per iteration) or per
    warpgroup (wgmma, WGMMAS_PER_GROUP per iteration)."""
    if instruction.warpgroup:
        return grid * iterations * WGMMAS_PER_GROUP * instruction.flops
    return grid * (MMA_BLOCK // 32) * iterations * CHAINS * instruction.flops


def scaled_iterations(iterations: int, measured_ms: float, target_ms: float, low: int = 16,
                      high: int = 1 << 22) -> int:
    """Iterations that make a launch of `iterations` that took `measured_ms` take about `target_ms`."""
    if measured_ms <= 0:
        return high
    return int(min(high, max(low, round(iterations * target_ms / measured_ms))))


def _runs_on(instruction: Instruction, capability: tuple[int, int]) -> bool:
    return instruction.min_capability <= tuple(capability) <= instruction.max_capability


def _capabilities(instruction: Instruction) -> str:
    low, high = ("%d.%d" % c for c in (instruction.min_capability, instruction.max_capability))
    if instruction.max_capability == (99, 99):
        return f"compute capability {low} or later"
    return f"compute capability {low}" if low == high else f"compute capability {low} to {high}"


def _resident_limit(kernel: driver.Kernel, block: int) -> int:
    cu = driver._cu()
    return driver.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(kernel.function, block, 0))


def _measure(gpu, instruction: Instruction, operands, sink, result: ProbeResult) -> None:
    kernel = gpu.kernel(instruction.file, instruction.entry, instruction.arch)
    block = WARPGROUP if instruction.warpgroup else MMA_BLOCK
    occupancies = WARPGROUPS_PER_SM if instruction.warpgroup else MMA_BLOCKS_PER_SM
    resident = _resident_limit(kernel, block)
    occupancies = [n for n in occupancies if n <= resident] or [resident]
    top = gpu.sm_count * max(occupancies)

    def launch(grid: int, iterations: int):
        return lambda: kernel.launch(grid, block, [(operands.ptr, "ptr"), (iterations, "int"), (sink.ptr, "ptr")])

    launch(top, CALIBRATION_ITERATIONS)()            # warms the clocks
    iterations = CALIBRATION_ITERATIONS
    for _ in range(2):        # the first guess is skewed by launch overhead; the second is not
        iterations = scaled_iterations(iterations, gpu.time_ms(launch(top, iterations)), TARGET_MS)
    per_sm = 4 if instruction.warpgroup else MMA_BLOCK // 32     # warps per block
    points, samples = [], {}
    for blocks_per_sm in occupancies:
        grid = gpu.sm_count * blocks_per_sm
        work = flops_per_launch(instruction, grid, iterations)
        rates = [work / (ms * 1e-3) for ms in gpu.repeat(launch(grid, iterations), REPETITIONS, LAUNCHES)]
        warps = blocks_per_sm * per_sm
        samples[warps] = rates
        points.append((warps, statistics.median(rates)))
        gpu.progress(f"  {instruction.name}: {warps:2d} warps/SM, {points[-1][1] / 1e12:.1f} TFLOP/s")
    best = max(samples, key=lambda w: statistics.median(samples[w]))
    m, n, k = instruction.shape
    unit = (f"{WGMMAS_PER_GROUP} per commit group, one group pending" if instruction.warpgroup
            else f"{CHAINS} independent accumulators per warp")
    result.figures.append(figure(
        f"{instruction.name}_flops", samples[best], "FLOP/s",
        f"{instruction.entry} m{m}n{n}k{k} ({instruction.operands} inputs, f32 accumulators, random operands), "
        f"{unit}, {best} warps per SM on every SM (best of {', '.join(str(w) for w, _ in points)}); "
        f"2*M*N*K FLOPs per instruction over event time"))
    result.curves[instruction.name] = Curve("warps per SM", "throughput (FLOP/s)", tuple(points))


def run(gpu) -> ProbeResult:
    result = ProbeResult()
    capability = tuple(gpu.compute_capability)
    sink = gpu.buffer(gpu.sm_count * max(WARPGROUPS_PER_SM[-1] * WARPGROUP, MMA_BLOCKS_PER_SM[-1] * MMA_BLOCK) * 4)
    operands = {}
    for instruction in INSTRUCTIONS:
        if not _runs_on(instruction, capability):
            result.notes.append(f"{instruction.name}: not measured; it needs {_capabilities(instruction)}, "
                                f"this device is {capability[0]}.{capability[1]}")
            continue
        if instruction.operands not in operands:
            buf = gpu.buffer(OPERAND_BYTES)
            buf.upload(random_operands(instruction.operands, OPERAND_BYTES))
            operands[instruction.operands] = buf
        _measure(gpu, instruction, operands[instruction.operands], sink, result)
    got = {f.name: f.value for f in result.figures}
    if capability == (9, 0) and "mma_sync_fp8_flops" in got:
        result.notes.append("mma_sync_fp8_flops: on sm_90 ptxas turns mma.sync e4m3 into a conversion and two f16 "
                            "MMAs, so this is an emulated rate; native fp8 on Hopper is wgmma_fp8_flops")
    if "wgmma_bf16_flops" in got and "mma_sync_bf16_flops" in got:
        result.notes.append(f"bf16: wgmma reaches {got['wgmma_bf16_flops'] / got['mma_sync_bf16_flops']:.2f}x "
                            "the mma.sync rate")
    for buf in (sink, *operands.values()):
        gpu.release(buf)
    return result
