"""How a captured graph spells each operation of rulesets/patterns.toml.

Dynamo records what the program called: `F.softmax(x, dim=-1)`, `x.softmax(-1)` and
`torch.softmax(x, 1)` are three targets with their own arguments. Each is resolved here
to its callable (functions by identity, methods by name) and a node's arguments are bound
to the operation's canonical parameter names, with defaults filled in, so that a pattern
sees one operation whatever the spelling.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
import torch.fx

from ..errors import InputError
from ..semantics.patterns import REQUIRED, Dtype, Literal, Operation, Patterns, Signature


@dataclass(frozen=True)
class Normal:
    """A node as one operation: every parameter of the operation's signature -> the graph's value."""
    operation: Operation
    arguments: dict


def default_value(expression):
    """The Python value a signature's default stands for (a dtype name -> the torch dtype)."""
    if isinstance(expression, Dtype):
        return getattr(torch, expression.name)
    if isinstance(expression, Literal):
        return expression.value
    raise ValueError(expression)


def _resolve(path: str):
    """The object an import path names ("torch.nn.functional.softmax"), or None."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                found = getattr(found, attribute)
            return found
        except AttributeError:
            return None
    return None


class Spellings:
    def __init__(self, patterns: Patterns):
        self.functions: dict[object, list[tuple[Operation, Signature]]] = {}
        self.methods: dict[str, list[tuple[Operation, Signature]]] = {}
        for operation in patterns.operations.values():
            for spelling, signature in operation.spellings.items():
                if spelling.startswith("Tensor."):
                    self.methods.setdefault(spelling.split(".", 1)[1], []).append((operation, signature))
                    continue
                target = _resolve(spelling)
                if target is None or not callable(target):
                    raise InputError(patterns.path, f"operations.{operation.name}.callables",
                                     f"callables this PyTorch ({torch.__version__}) has", spelling)
                self.functions.setdefault(target, []).append((operation, signature))
        self._normal: dict[torch.fx.Node, tuple[Normal, ...]] = {}

    def forget(self) -> None:
        """Drop what normalize() remembered: after a rewrite, nodes' arguments are other nodes."""
        self._normal.clear()

    def normalize(self, node: torch.fx.Node) -> tuple[Normal, ...]:
        """The operations this node computes (usually one; none for any other node)."""
        if node not in self._normal:
            self._normal[node] = tuple(self._bind(node))
        return self._normal[node]

    def _bind(self, node: torch.fx.Node):
        if node.op == "call_function":
            try:
                candidates = self.functions.get(node.target, ())
            except TypeError:   # an unhashable target: no spelling of ours
                candidates = ()
        elif node.op == "call_method":
            candidates = self.methods.get(node.target, ())
        else:
            candidates = ()
        for operation, signature in candidates:
            bound = signature.bind(node.args, node.kwargs)
            if bound is None:
                continue
            own = {p.name: p.default for p in signature.parameters}
            arguments = {}
            for p in operation.signature.parameters:
                if p.name in bound:
                    arguments[p.name] = bound[p.name]
                elif own.get(p.name, REQUIRED) is not REQUIRED:
                    arguments[p.name] = default_value(own[p.name])
                else:
                    arguments[p.name] = default_value(p.default)
            yield Normal(operation, arguments)

    def describe(self, node: torch.fx.Node) -> str:
        """`name (operation)` for reports: the operation's name where the node spells one."""
        normal = self.normalize(node)
        return f"node {node.name} ({normal[0].operation.name if normal else target_name(node)})"


def target_name(node: torch.fx.Node) -> str:
    """What a node calls, in a few words: the function's or method's name, or the node's kind."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return getattr(node.target, "__name__", None) or str(node.target)
    return node.op
