"""Identity of the toolchain that turns sources into cubins.

It joins the key of every compile step: a different NVRTC gives other
cubins (the same NVRTC gives byte-identical ones on any machine). Package
versions are read from installed metadata, which costs no library load.
"""
from __future__ import annotations

import functools
from importlib import metadata


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def identity() -> dict:
    nvrtc = _version("nvidia-cuda-nvrtc")
    if nvrtc is None:  # an NVRTC from a CUDA toolkit rather than a wheel
        from .nvrtc import bindings
        _, major, minor = bindings().nvrtcVersion()
        nvrtc = f"toolkit-{major}.{minor}"
    return {"nvrtc": nvrtc, "cuda-bindings": _version("cuda-bindings")}
