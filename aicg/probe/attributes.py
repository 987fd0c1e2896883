"""Device attributes as the driver reports them, and the SM clock seen under load.

The driver's attributes (SMs, threads, registers, shared memory, L2 size)
replace the datasheet's where both exist: they are what this device, with
this driver, actually offers. The SM clock is measured: one block per SM
spins for a fixed number of `clock64` cycles and device events time the
launch; cycles over time is the clock the kernels ran at. The spin's count
is written out, so the loop is not removed.

Read by the planner: every plan input named after a device limit
(`sm_count`, `max_threads_per_sm`, `max_blocks_per_sm`, `registers_per_sm`,
`l2_cache`, `max_threads_per_block`) resolves to these measured values.
"""
from __future__ import annotations

from .figures import ProbeResult, exact, figure

NAME = "attributes"
SOURCES = (("clock.cu", ("sm_80", "sm_90")),)

# hwdb fact <- driver attribute, with the unit hw.REQUIRED_FACTS expects.
FROM_ATTRIBUTE = {
    "sm_count": ("MULTIPROCESSOR_COUNT", "SM"),
    "warp_size": ("WARP_SIZE", "thread"),
    "max_threads_per_block": ("MAX_THREADS_PER_BLOCK", "thread"),
    "max_threads_per_sm": ("MAX_THREADS_PER_MULTIPROCESSOR", "thread"),
    "max_blocks_per_sm": ("MAX_BLOCKS_PER_MULTIPROCESSOR", "block"),
    "registers_per_sm": ("MAX_REGISTERS_PER_MULTIPROCESSOR", "32-bit register"),
    "shared_memory_per_block": ("MAX_SHARED_MEMORY_PER_BLOCK", "byte"),
    "shared_memory_per_block_optin": ("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "byte"),
    "shared_memory_per_sm": ("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", "byte"),
    "l2_cache": ("L2_CACHE_SIZE", "byte"),
}
FIGURES = {**{name: unit for name, (_, unit) in FROM_ATTRIBUTE.items()},
           "boost_clock": "MHz", "sm_clock_under_load": "MHz"}

SPIN_CYCLES = 20_000_000   # about 10 ms at 2 GHz: long against launch and event resolution


def run(gpu) -> ProbeResult:
    result = ProbeResult()
    for name, (attribute, unit) in FROM_ATTRIBUTE.items():
        result.figures.append(exact(name, gpu.attributes[attribute], unit,
                                    f"cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_{attribute})"))
    result.figures.append(exact("boost_clock", gpu.attributes["CLOCK_RATE"] / 1000, "MHz",
                                "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE): the driver's maximum SM clock"))

    spin = gpu.kernel("clock.cu", "spin")
    sink = gpu.buffer(8 * gpu.sm_count)
    samples = gpu.repeat(lambda: spin.launch(gpu.sm_count, 32, [(SPIN_CYCLES, "i64"), (sink.ptr, "ptr")]),
                         repetitions=7, launches=3)
    # cycles / (ms * 1e3) = MHz
    result.figures.append(figure("sm_clock_under_load", [SPIN_CYCLES / (ms * 1e3) for ms in samples], "MHz",
                                 f"one block per SM spins {SPIN_CYCLES} clock64 cycles; device events time the launch"))
    max_mhz = gpu.attributes["CLOCK_RATE"] / 1000
    seen = result.figures[-1].value
    if seen < 0.9 * max_mhz:
        result.notes.append(f"SM clock under load {seen:.0f} MHz is below 90% of the maximum {max_mhz:.0f} MHz: "
                            "the GPU was throttled or power-capped while probing")
    return result
