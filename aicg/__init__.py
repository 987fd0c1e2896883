"""aicg: an AI compiler generator.

From a rule selection, measured facts about a GPU, and kernel templates, aicg
builds a compiler instance: validated, tuned kernels and the reasons behind
each choice. `doit build` builds one; `aicg.load` runs its kernels.
"""


def __getattr__(name):
    # Loaded on first use: `doit list` and a no-op build import aicg but need neither (numpy, CUDA).
    if name == "backend":
        from .fx import backend
        return backend
    if name == "load":
        from .runtime.instance import load
        return load
    raise AttributeError(f"module 'aicg' has no attribute {name!r}")


__all__ = ["backend", "load"]
__version__ = "0.1.0"
