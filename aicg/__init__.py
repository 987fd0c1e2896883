"""aicg: an AI compiler generator.

From a rule selection, measured facts about a GPU, and kernel templates, aicg
builds a compiler instance: validated, tuned kernels and the reasons behind
each choice. `doit build` builds one; `aicg.load` runs its kernels.
"""
from .fx import backend
from .runtime.instance import load

__all__ = ["backend", "load"]
__version__ = "0.1.0"
