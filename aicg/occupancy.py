"""A candidate's build: ptxas's own, or one whose launch bound asks for one more resident block.

With a bare `__launch_bounds__(threads)`, ptxas takes as many registers as its schedule wants, up
to the share of a full block. A kernel that holds a row in registers can then end up one block to
an SM, where nothing overlaps a row's reductions with another row's loads. So where the plain
build leaves one block of a row-holding kernel per SM, a second build asks for two
(`__launch_bounds__(threads, 2)`, and AICG_MIN_BLOCKS for kernels/row_access.cuh, which then
holds every row through one path), and is kept when ptxas spills at most a few words a thread
there (stored once, reloaded from L1). On the H200, layernorm bfloat16 t512 c8 took 127 registers (one
block, 162.8 us at 4096x32768); asked for two, 64 without a spill (150.4 us); float16 128
registers (162.4 us), asked for two 64 and a 4-byte spill (139.3 us). A block of 1024 threads is
not asked: two of them leave 32 registers a thread, fewer than any held row needs beside its sweeps.
"""
from __future__ import annotations

import threading

from . import codegen, digest, nvrtc

ASKED_BLOCKS = 2
MOST_THREADS_ASKED = 512
SPILL_KEPT_BYTES = 16     # four words a thread stored
POLICY = {"asked_blocks": ASKED_BLOCKS, "most_threads_asked": MOST_THREADS_ASKED, "spill_kept_bytes": SPILL_KEPT_BYTES}


def resident_blocks(registers: int, threads: int, registers_per_sm: int) -> int:
    return registers_per_sm // max(1, registers * threads)


def may_ask(params: dict) -> bool:
    """Whether a second build may be asked for, before the first has reported its registers."""
    return params.get("cache_packs", 0) > 0 and params["threads"] <= MOST_THREADS_ASKED


def worth_asking(params: dict, report: dict, registers_per_sm: int) -> bool:
    return (may_ask(params) and report["reported"]
            and resident_blocks(report["registers"], params["threads"], registers_per_sm) < ASKED_BLOCKS)


def compile_key(source: str, header_digests: dict[str, str], arch: str, params: dict,
                registers_per_sm: int) -> str:
    return digest.of_value({"compile": nvrtc.compile_key(source, header_digests, arch), "occupancy": POLICY,
                            "threads": params["threads"], "cache_packs": params.get("cache_packs", 0),
                            "registers_per_sm": registers_per_sm})


def compile_candidate(source: str, source_name: str, headers: dict[str, bytes], arch: str, params: dict,
                      registers_per_sm: int, concurrent: bool = False) -> tuple[bytes, dict, str]:
    """(cubin, resource report, ptxas log) as nvrtc.compile_cubin gives them; the report's
    `asked_blocks` says whether a second build asked for more blocks (0: none was made), and
    `min_blocks` what the kept build's launch bound asks for (0: nothing).

    `concurrent`: where a second build may be wanted, start it beside the first instead of after
    it (NVRTC runs outside the GIL), for a caller who waits on this one kernel (the JIT's first
    call); the same cubin comes back, and the second build is thrown away where the first does not
    ask for it. A build of many kernels keeps the cores busy with other kernels instead."""
    asked = codegen.with_min_blocks(source, params["threads"], ASKED_BLOCKS) if may_ask(params) else None
    speculative = None
    if concurrent and asked is not None:
        speculative = _Background(nvrtc.compile_cubin, asked, source_name, headers, arch)
    cubin, report, log = nvrtc.compile_cubin(source, source_name, headers, arch)
    if not worth_asking(params, report, registers_per_sm):
        return cubin, {**report, "asked_blocks": 0, "min_blocks": 0}, log
    bounded, bounded_report, bounded_log = (speculative.result() if speculative is not None
                                            else nvrtc.compile_cubin(asked, source_name, headers, arch))
    # the words spilled, each stored once and reloaded where used (float16 above: 4 bytes, 40 reloaded)
    if bounded_report["reported"] and bounded_report["spill_store_bytes"] <= SPILL_KEPT_BYTES:
        return bounded, {**bounded_report, "asked_blocks": ASKED_BLOCKS, "min_blocks": ASKED_BLOCKS}, bounded_log
    return cubin, {**report, "asked_blocks": ASKED_BLOCKS, "min_blocks": 0}, log


class _Background:
    """A call on a thread of its own, started now, its result (or exception) taken later. A thread a
    call, not a pool: a pool's worker does not survive a fork, and a child process would wait on it
    for ever."""

    def __init__(self, function, *args):
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(function, args), name="aicg-nvrtc", daemon=True)
        self._thread.start()

    def _run(self, function, args) -> None:
        try:
            self._value = function(*args)
        except BaseException as err:    # handed to the caller of result()
            self._error = err

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
