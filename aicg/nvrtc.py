"""NVRTC through cuda-python: source and headers in, cubin and resource report out.

Headers are handed to NVRTC from memory, exactly the bytes that were hashed
into the compile key, so no file read behind the key's back can change a
cubin. The resource report (registers, shared memory, spills) comes from
ptxas' verbose output; lines that vary between runs (timings) are dropped
so that the same inputs give the same artifact.

NVRTC (12.9 and later) also keeps compiled programs in the CUDA driver's
compute cache wherever a driver is installed, and a program it finds there
comes back without ptxas' report: on the H200 node a candidate compiled a
second time reported 0 registers and no spills. aicg's store already keeps
every compile with its report, so NVRTC's cache is turned off through
CUDA_CACHE_DISABLE, which NVRTC reads when it sets the cache up: the variable
is set from aicg's first NVRTC call until its first compile ends, then given
back its value. A report that is missing all the same says so
(`reported: False`) rather than passing for a kernel of no registers.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import threading
import time
from pathlib import Path

from . import digest, toolchain
from .errors import CompileError

OPTIONS = ("-std=c++17", "-default-device", "--ptxas-options=-v")

_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.M)

# Count of compilations in this process: tests check restores run none.
compilations = 0


def compile_key(source: str, header_digests: dict[str, str], arch: str) -> str:
    """What decides a cubin: NVRTC gives the same bytes for the same source, headers (by digest),
    target, options and toolchain. The lab's store and the JIT's cache both key cubins by it."""
    return digest.of_value({"source": source, "headers": header_digests, "arch": arch, "options": list(OPTIONS),
                            "toolchain": toolchain.identity()})


def include_closure(header: str, kernels_dir: Path) -> dict[str, bytes]:
    """Every header of kernels/ that `header` includes, transitively, by name."""
    found: dict[str, bytes] = {}
    pending = [header]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        path = Path(kernels_dir) / name
        try:
            found[name] = path.read_bytes()
        except FileNotFoundError:
            raise CompileError(f"{path}: included header not found") from None
        except OSError as err:
            raise CompileError(f"{path}: cannot read included header ({err.strerror or err})") from None
        pending.extend(m.decode() for m in _INCLUDE.findall(found[name]))
    return dict(sorted(found.items()))


_CACHE_SWITCH = "CUDA_CACHE_DISABLE"
_started = False
_switch_before: tuple[str | None] | None = None   # the variable's value before, until the first compile ends


def bindings():
    """cuda-python's NVRTC module, its cache turned off before NVRTC first runs in this process."""
    global _started, _switch_before
    if not _started:
        _started, _switch_before = True, (os.environ.get(_CACHE_SWITCH),)
        os.environ[_CACHE_SWITCH] = "1"
    from cuda.bindings import nvrtc
    return nvrtc


def _give_back_cache_switch() -> None:
    global _switch_before
    if _switch_before is not None:
        (before,), _switch_before = _switch_before, None
        if before is None:
            os.environ.pop(_CACHE_SWITCH, None)
        else:
            os.environ[_CACHE_SWITCH] = before


def _check(result, what: str):
    """The value of an NVRTC call that returns (status, value), or CompileError."""
    nvrtc = bindings()
    err, *values = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"NVRTC {what} failed: {err.name}")
    return values[0] if values else None


def _program_log(prog) -> str:
    # NVRTC writes into the buffer it is given: a bytes object would be written in place, and an
    # empty log (one NUL) would land in the interpreter's shared one-byte b" ", after which every
    # b" " in the process reads as a NUL.
    nvrtc = bindings()
    size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
    buf = bytearray(size)
    _check(nvrtc.nvrtcGetProgramLog(prog, buf), "log")
    return bytes(buf).rstrip(b"\x00 ").decode(errors="replace")


def parse_report(log: str) -> dict:
    """Registers, shared memory, stack and spills of the entry from ptxas -v; `reported` is False
    where the log holds no report (the figures are then zeros that mean nothing)."""
    def number(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0
    return {
        "reported": re.search(r"Used \d+ registers", log) is not None,
        "registers": number(r"Used (\d+) registers"),
        "shared_bytes": number(r"(\d+) bytes smem"),
        "stack_bytes": number(r"(\d+) bytes stack frame"),
        "spill_store_bytes": number(r"(\d+) bytes spill stores"),
        "spill_load_bytes": number(r"(\d+) bytes spill loads"),
        "barriers": number(r"used (\d+) barriers"),
    }


def compile_cubin(source: str, source_name: str, headers: dict[str, bytes], arch: str,
                  header_dir: str = "kernels") -> tuple[bytes, dict, str]:
    """(cubin, resource report, compiler log) or CompileError naming files and lines; a program
    compile_ahead started is waited for instead of compiled again.

    Where another library set NVRTC's cache up before aicg's first compile (PyTorch, say), the
    cache stays on, and a program compiled before by any process comes back without ptxas'
    report. It is then compiled once more with a comment that no earlier program had: the cache
    misses, ptxas runs and reports, and the code is the same (a comment changes no instruction)."""
    if _ahead:   # only then is the program's key worth hashing (the JIT and the lab compile without)
        with _ahead_lock:
            started = _ahead.pop(_program_key(source, source_name, headers, arch, header_dir), None)
        if started is not None:
            return started.result()
    return _compile_now(source, source_name, headers, arch, header_dir)


def _compile_now(source: str, source_name: str, headers: dict[str, bytes], arch: str,
                 header_dir: str) -> tuple[bytes, dict, str]:
    cubin, report, log = _compile_once(source, source_name, headers, arch, header_dir)
    if not report["reported"]:
        fresh = f"{source}\n// aicg: compiled again for ptxas' report ({os.getpid()}, {time.time_ns()})\n"
        cubin, report, log = _compile_once(fresh, source_name, headers, arch, header_dir)
    return cubin, report, log


# Programs compile_ahead started, by _program_key: a build that runs its steps one at a time (on
# a GPU node) compiles the rest of its kernels on threads while it validates the first ones.
_ahead: dict[str, concurrent.futures.Future] = {}
_ahead_lock = threading.Lock()
_ahead_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _program_key(source: str, source_name: str, headers: dict[str, bytes], arch: str, header_dir: str) -> str:
    return digest.of_value({"source": source, "name": source_name, "arch": arch, "header_dir": header_dir,
                            "headers": {name: digest.of_bytes(data) for name, data in headers.items()}})


def compile_ahead(programs, workers: int) -> int:
    """Start compiling `programs` ((source, source_name, headers, arch), as compile_cubin takes them)
    on up to `workers` threads (NVRTC releases the GIL); compile_cubin of one of them later waits for
    its result, the same cubin, report and log, or its CompileError. Returns how many it started.
    Not for a process that forks workers: a pool does not survive a fork (the child forgets it)."""
    global _ahead_pool
    warm_up_in_background()
    _warming.join()     # NVRTC's start (and its cache switch) once, before the threads compile
    started = 0
    with _ahead_lock:
        if _ahead_pool is None:
            _ahead_pool = concurrent.futures.ThreadPoolExecutor(max(1, workers), thread_name_prefix="aicg-nvrtc")
        for source, source_name, headers, arch in programs:
            key = _program_key(source, source_name, headers, arch, "kernels")
            if key not in _ahead:
                _ahead[key] = _ahead_pool.submit(_compile_now, source, source_name, headers, arch, "kernels")
                started += 1
    return started


def finish_ahead() -> None:
    """Drop what compile_ahead started and no compile took (a build that ended early): what has not
    begun is cancelled, what is compiling is waited for, so that nothing compiles after the build."""
    with _ahead_lock:
        pending = list(_ahead.values())
        _ahead.clear()
    for future in pending:
        future.cancel()
    concurrent.futures.wait(pending)


def _forget_ahead() -> None:
    """In a forked child: the parent's threads are not there to finish what they started."""
    global _ahead_pool, _ahead_lock
    _ahead.clear()
    _ahead_pool, _ahead_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_ahead)


WARM_UP_SOURCE = 'extern "C" __global__ void aicg_warm_up(float* x) { x[threadIdx.x] += 1.0f; }\n'
_warming: threading.Thread | None = None
_warm_lock = threading.Lock()


def warm_up_in_background() -> None:
    """NVRTC's first compile in a process pays a start of its own (the library, its builtins and
    ptxas set up: 0.2 s on a 2-core CPU, 0.4-0.5 s on the GPU node). A JIT that may compile on a
    first call pays it ahead, once a process, on a thread (NVRTC releases the GIL); uncounted, and
    a failure is left for the real compile to report."""
    global _warming
    with _warm_lock:
        if _warming is not None:
            return
        def warm():
            try:
                _compile_once(WARM_UP_SOURCE, "aicg-warm-up.cu", {}, "sm_80", "kernels", counted=False)
            except Exception:   # noqa: BLE001 - the compile that needs NVRTC reports what is wrong
                pass
        _warming = threading.Thread(target=warm, name="aicg-nvrtc-warm-up", daemon=True)
        _warming.start()


def _compile_once(source: str, source_name: str, headers: dict[str, bytes], arch: str,
                  header_dir: str, counted: bool = True) -> tuple[bytes, dict, str]:
    global compilations
    nvrtc = bindings()

    names = list(headers)
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), source_name.encode(), len(names),
                                           [headers[n] for n in names], [n.encode() for n in names]),
                  "create program")
    try:
        options = [f"-arch={arch}".encode(), *(o.encode() for o in OPTIONS)]
        compilations += counted
        try:
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
        finally:
            _give_back_cache_switch()
        log = _program_log(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            # NVRTC names headers by include name; point at their files.
            log = re.sub(r"^(" + "|".join(map(re.escape, names)) + r")\(", rf"{header_dir}/\1(", log,
                         flags=re.M) if names else log
            raise CompileError(f"NVRTC could not compile {source_name} for {arch}:\n{log.strip()}")
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "get cubin")
        cubin = bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    stable_log = "\n".join(line for line in log.splitlines() if "Compile time" not in line).strip()
    return cubin, parse_report(stable_log), stable_log
