"""The torch.compile backend of an instance (see aicg/fx/__init__.py).

Graphs are taken as Dynamo captures them, before AOTAutograd: the model's operations are
still whole there (softmax, layer_norm, rms_norm one node each, not Inductor's version-
dependent decompositions into amax/sub/exp/sum/div), each node carries its example tensor
(dtype, shape, strides: what the contract checks), and after the replacements the graph goes
to Inductor through the entry point torch.compile's own "inductor" backend uses, so that
AOTAutograd, training graphs, dynamic shapes and max-autotune work as they do without aicg:
the instance's operators reach Inductor as custom operators with fake implementations and
PyTorch-formula backwards. The cost of working before AOTAutograd is several spellings of
one operation (F.softmax, x.softmax, torch.softmax), which rulesets/patterns.toml lists.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..semantics import patterns as patterns_loader
from .legal import InstanceRules
from .lower import lower
from .report import GraphReport
from .spellings import Spellings

log = logging.getLogger("aicg.fx")
SHIPPED_PATTERNS = Path(__file__).resolve().parents[2] / "rulesets" / "patterns.toml"


def patterns_path(instance_path: Path) -> Path:
    """The instance's own patterns file (source/rulesets/patterns.toml), else the rule sets'."""
    own = Path(instance_path) / "source" / "rulesets" / "patterns.toml"
    return own if own.is_file() else SHIPPED_PATTERNS


class Backend:
    def __init__(self, instance, *, mode=None, options=None, inner=None, patterns=None):
        if instance.namespace is None:
            raise ValueError(f"instance {instance.path} was loaded without PyTorch, so its operators are not "
                             f"registered: load it again in a process that can import torch")
        self.instance, self.mode, self.options = instance, mode, dict(options or {})
        self.inner = "inductor" if inner is None else inner
        self._check_mode(mode)
        self.rules = InstanceRules(instance.path)
        self.patterns = patterns_loader.load(Path(patterns) if patterns else patterns_path(instance.path),
                                             self.rules.ruleset.rules)
        self.spellings = Spellings(self.patterns)   # resolves every callable now: a bad name fails here
        self.reports: list[GraphReport] = []

    @staticmethod
    def _check_mode(mode) -> None:
        modes = torch._inductor.list_mode_options()
        if mode is not None and mode not in modes:
            raise ValueError(f"mode: expected one of {', '.join(map(repr, sorted(modes)))}, got {mode!r}")

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, mode=None, options=None):
        """What torch.compile calls with each captured graph (and its mode=/options=, if given there)."""
        report = lower(gm, self.instance.ops, self.instance.namespace, self.patterns, self.spellings, self.rules,
                       getattr(self.instance, "matrix", None))
        self.reports.append(report)
        log.info("%s", report.text())
        return self._compile(gm, example_inputs, mode or self.mode, {**self.options, **(options or {})})

    def _compile(self, gm, example_inputs, mode, options):
        if callable(self.inner):
            return self.inner(gm, example_inputs)
        if self.inner == "eager":
            return gm.forward
        if self.inner != "inductor":
            return torch._dynamo.lookup_backend(self.inner)(gm, example_inputs)
        self._check_mode(mode)
        from torch._inductor.compile_fx import compile_fx
        patches = {**(torch._inductor.list_mode_options(mode) if mode else {}), **options}
        return compile_fx(gm, example_inputs, config_patches=patches)

    def counts(self) -> dict[str, int]:
        """Instance operators placed, over every graph compiled so far, by operator."""
        total: dict[str, int] = {}
        for report in self.reports:
            for op, n in report.counts().items():
                total[op] = total.get(op, 0) + n
        return total

    def report(self) -> str:
        return "\n".join(f"graph {i}: {r.text()}" for i, r in enumerate(self.reports)) or "no graph compiled yet"
