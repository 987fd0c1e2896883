"""Matching a pattern's expression (aicg/semantics/patterns.py) at one node of a graph.

A match walks the expression from its outermost call down the node's inputs, binding the
operator's arguments (captures) and where-names as it goes, and trying both orders of a
commutative operation's two inputs. It yields every way the expression fits; where none
does, `failure` keeps the reason found furthest into the pattern (most operations matched),
which is what a report says about a node that almost matched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.fx

from ..semantics.patterns import Anything, Call, Capture, Dtype, Literal, Named, Pattern
from .spellings import Spellings, default_value


@dataclass(frozen=True)
class Match:
    captures: dict            # operator argument -> graph value (a node, or a constant for a scalar)
    named: dict               # where-name -> node
    nodes: tuple              # the operation nodes matched, the root first

    def bind(self, **more) -> "Match":
        return Match({**self.captures, **more.get("captures", {})}, {**self.named, **more.get("named", {})},
                     self.nodes + more.get("nodes", ()))


@dataclass
class Failure:
    depth: int                # operations matched before it
    reason: str


def example(value):
    """The example tensor Dynamo recorded for a node (a FakeTensor), the tensor a get_attr node
    names, or None."""
    if not isinstance(value, torch.fx.Node):
        return None
    found = value.meta.get("example_value")
    if found is None and value.op == "get_attr" and value.graph.owning_module is not None:
        found = value.graph.owning_module
        for part in str(value.target).split("."):
            found = getattr(found, part, None)
    return found


def _plain(value):
    return tuple(_plain(v) for v in value) if isinstance(value, (list, tuple)) else value


def same_constant(found, wanted) -> bool:
    found, wanted = _plain(found), _plain(wanted)
    if isinstance(found, tuple) or isinstance(wanted, tuple):
        return isinstance(found, tuple) and isinstance(wanted, tuple) and len(found) == len(wanted) and \
            all(same_constant(f, w) for f, w in zip(found, wanted))
    if isinstance(found, bool) or isinstance(wanted, bool):
        return type(found) is type(wanted) and found == wanted
    if isinstance(found, torch.fx.Node) or isinstance(wanted, torch.fx.Node):
        return found is wanted
    try:
        return bool(found == wanted)
    except Exception:   # a symbolic value, or one that will not compare: not this constant
        return False


def normal_dims(value, rank: int | None):
    """Dimensions as a tuple of negative indices (-1 the last), or the value itself where it is not one."""
    dims = _plain(value)
    if isinstance(dims, int) and not isinstance(dims, bool):
        dims = (dims,)
    if rank is None or not isinstance(dims, tuple) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                                for d in dims):
        return dims
    return tuple(d - rank if d >= 0 else d for d in dims)


def _show(value) -> str:
    if isinstance(value, torch.fx.Node):
        return f"node {value.name}"
    return repr(_plain(value)).replace("torch.", "")


class Matcher:
    def __init__(self, spellings: Spellings):
        self.spellings = spellings

    def match(self, pattern: Pattern, root: torch.fx.Node) -> tuple[list[Match], Failure | None]:
        self.pattern, self.failure = pattern, None
        found = list(self._expression(pattern.match, root, Match({}, {}, ()), "the result"))
        return found, (None if found else self.failure)

    def _fail(self, state: Match, context: str, reason: str) -> None:
        if self.failure is None or len(state.nodes) > self.failure.depth:
            self.failure = Failure(len(state.nodes), f"{context}: {reason}")

    def _expression(self, expression, value, state: Match, context: str) -> Iterator[Match]:
        """`context`: where in the graph `value` is, for a failure's reason ("mul_3 (mul), other")."""
        if isinstance(expression, Anything):
            yield state
        elif isinstance(expression, Literal):
            if same_constant(value, expression.value):
                yield state
            else:
                self._fail(state, context, f"{_show(value)}, the pattern needs {_show(expression.value)}")
        elif isinstance(expression, Dtype):
            if isinstance(value, torch.dtype) and value == default_value(expression):
                yield state
            else:
                self._fail(state, context, f"{_show(value)}, the pattern needs {expression.name}")
        elif isinstance(expression, Capture):
            yield from self._capture(expression.name, value, state, context)
        elif isinstance(expression, Named):
            yield from self._named(expression.name, value, state, context)
        else:
            yield from self._call(expression, value, state, context)

    def _capture(self, name: str, value, state: Match, context: str) -> Iterator[Match]:
        if name not in state.captures:
            yield state.bind(captures={name: value})
        elif same_constant(state.captures[name], value):
            yield state
        else:
            self._fail(state, context, f"{_show(value)}, where {name} is already {_show(state.captures[name])}")

    def _named(self, name: str, value, state: Match, context: str) -> Iterator[Match]:
        if name in state.named:
            if state.named[name] is value:
                yield state
            else:
                self._fail(state, context, f"{_show(value)}, where {name} is already {_show(state.named[name])}")
            return
        for inner in self._expression(self.pattern.where[name], value, state, context):
            yield inner.bind(named={name: value})

    def _call(self, call: Call, value, state: Match, context: str) -> Iterator[Match]:
        if not isinstance(value, torch.fx.Node):
            self._fail(state, context, f"{_show(value)}, the pattern needs {call.operation}(...)")
            return
        normals = [n for n in self.spellings.normalize(value) if n.operation.name == call.operation]
        if not normals:
            self._fail(state, context, f"{self.spellings.describe(value)}, the pattern needs {call.operation}(...)")
            return
        for normal in normals:
            operation = normal.operation
            orders = [normal.arguments]
            if operation.commutative:
                first, second = operation.signature.positional()[:2]
                orders.append({**normal.arguments, first: normal.arguments[second], second: normal.arguments[first]})
            for arguments in orders:
                yield from self._arguments(call, operation, arguments, value, state.bind(nodes=(value,)))

    def _arguments(self, call: Call, operation, arguments: dict, node, state: Match) -> Iterator[Match]:
        given = call.given()
        rank = getattr(example(arguments.get(operation.signature.positional()[0])), "ndim", None)
        now, later = [], []   # constants first: a wrong dim is a better reason than a mismatch deep below
        for p in operation.signature.parameters:
            wanted = given.get(p.name, p.default)
            found = arguments[p.name]
            if p.name in operation.dims:
                found = normal_dims(found, rank)
                if isinstance(wanted, Literal):
                    wanted = Literal(normal_dims(wanted.value, rank))
            (later if isinstance(wanted, (Call, Named)) else now).append((p.name, wanted, found))
        where = self.spellings.describe(node)

        def walk(items, state: Match) -> Iterator[Match]:
            if not items:
                yield state
                return
            (name, wanted, found), rest = items[0], items[1:]
            for inner in self._expression(wanted, found, state, f"{where}, {name}"):
                yield from walk(rest, inner)
        yield from walk(now + later, state)
