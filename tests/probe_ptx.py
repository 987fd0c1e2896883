"""Reading the PTX and the ptxas report of probe kernels, for the tests that check what they issue."""
from __future__ import annotations

import functools
import re

from aicg import nvrtc
from aicg.probe.gpu import KERNELS_DIR, PROBE_KERNELS


@functools.cache
def ptx(file: str, arch: str) -> str:
    """NVRTC's PTX of kernels/probes/<file> for `arch` (sm_90a gives compute_90a)."""
    from cuda.bindings import nvrtc as rtc
    source = (KERNELS_DIR / PROBE_KERNELS / file).read_bytes()
    err, prog = rtc.nvrtcCreateProgram(source, file.encode(), 0, [], [])
    assert err == rtc.nvrtcResult.NVRTC_SUCCESS
    try:
        options = [f"-arch=compute_{arch.removeprefix('sm_')}".encode(), *(o.encode() for o in nvrtc.OPTIONS)]
        (err,) = rtc.nvrtcCompileProgram(prog, len(options), options)
        assert err == rtc.nvrtcResult.NVRTC_SUCCESS, f"{file} for {arch}: {err}"
        err, size = rtc.nvrtcGetPTXSize(prog)
        assert err == rtc.nvrtcResult.NVRTC_SUCCESS
        text = b" " * size
        (err,) = rtc.nvrtcGetPTX(prog, text)
        assert err == rtc.nvrtcResult.NVRTC_SUCCESS
    finally:
        rtc.nvrtcDestroyProgram(prog)
    return text.rstrip(b"\x00").decode()


@functools.cache
def entries(file: str, arch: str) -> dict[str, str]:
    """Each entry's PTX (parameter list and body), by name."""
    parts = re.split(r"^\.visible \.entry (\w+)\(", ptx(file, arch), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def loops(body: str) -> list[str]:
    """The PTX between each label and a later branch back to it: the loop bodies."""
    found = []
    for label in re.finditer(r"^(\$L__\w+):", body, flags=re.M):
        back = re.search(rf"bra(?:\.uni)?\s+{re.escape(label.group(1))};", body[label.end():])
        if back:
            found.append(body[label.end():label.end() + back.start()])
    return found


@functools.cache
def report(file: str, arch: str) -> dict[str, str]:
    """ptxas' verbose report, split by entry."""
    name = f"{PROBE_KERNELS}/{file}"
    _, _, log = nvrtc.compile_cubin((KERNELS_DIR / name).read_text(), name, {}, arch)
    parts = re.split(r"Compiling entry function '(\w+)'", log)
    return dict(zip(parts[1::2], parts[2::2]))
