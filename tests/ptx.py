"""The PTX NVRTC makes of a kernel source, for tests that check what the compiler was given. CPU only."""
from __future__ import annotations

from aicg import nvrtc


def ptx_of(source: str, headers: dict[str, bytes]) -> str:
    bindings = nvrtc.bindings()
    names = list(headers)
    prog = nvrtc._check(bindings.nvrtcCreateProgram(source.encode(), b"kernel.cu", len(names),
                                                    [headers[n] for n in names], [n.encode() for n in names]),
                        "create program")
    try:
        options = [b"-arch=compute_90", b"-std=c++17", b"-default-device"]
        (err,) = bindings.nvrtcCompileProgram(prog, len(options), options)
        assert err == bindings.nvrtcResult.NVRTC_SUCCESS, nvrtc._program_log(prog)
        ptx = bytearray(nvrtc._check(bindings.nvrtcGetPTXSize(prog), "PTX size"))
        nvrtc._check(bindings.nvrtcGetPTX(prog, ptx), "get PTX")
    finally:
        bindings.nvrtcDestroyProgram(prog)
    return ptx.rstrip(b"\0").decode()
