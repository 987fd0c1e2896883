"""torch.compile onto an instance: `torch.compile(model, backend=aicg.backend(inst))`.

The backend (aicg/fx/compiler.py) takes each graph Dynamo captures, replaces every pattern
of rulesets/patterns.toml that the instance can run with the instance's custom operators
(aicg/fx/lower.py), and hands the graph to Inductor; it reports what it replaced and why it
left the rest. PyTorch is imported only when a backend is made: `import aicg` does not
need it.
"""
from __future__ import annotations


def backend(instance, *, mode: str | None = None, options: dict | None = None, inner=None, patterns=None):
    """A torch.compile backend that runs what `instance` (aicg.load) can run on its kernels.

    mode, options: Inductor's (as torch.compile's mode= and options=, which may be given
    there instead: "max-autotune", {"triton.cudagraphs": True}, ...). inner: what compiles
    the graph after the replacements: "inductor" (the default), "eager", another registered
    torch.compile backend's name, or a backend function. patterns: a patterns file
    (default: the instance's own, else rulesets/patterns.toml).
    The backend's `reports` list what each captured graph got; `report()` says it in words.
    """
    from .compiler import Backend
    return Backend(instance, mode=mode, options=options, inner=inner, patterns=patterns)

