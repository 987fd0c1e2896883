"""Lowering a captured graph onto an instance: each pattern the instance can run, replaced.

Patterns are tried in the order rulesets/patterns.toml gives after sorting (more
operations first), each at every node that computes its outermost operation. A match the
kernel takes (aicg/fx/contract.py) becomes one call of the instance's custom operator, and
the nodes it replaces go; the first match that fails, or where none fits, the reason found
furthest into the pattern, is reported. A structural near-miss is reported only where more
than half the pattern's operations matched (the one of a single-operation pattern), so that
every `add` of a graph is not a "declined bias_gelu_residual", and not at a node that another
pattern replaced or declined for a reason other than its structure. Matrix patterns
(F.linear and its epilogue onto inst.matmul) are tried only where the instance has matrix
kernels.
"""
from __future__ import annotations

import math
from collections import Counter

import torch
import torch.fx

from ..ops import OPERATORS
from ..semantics.patterns import Pattern, Patterns, matrix_epilogue
from . import contract
from .legal import InstanceRules
from .match import Match, Matcher, example
from .report import Declined, GraphReport, Replaced
from .spellings import Spellings, target_name


def lower(gm: torch.fx.GraphModule, kernels_by_op: dict, namespace: str, patterns: Patterns,
          spellings: Spellings, rules: InstanceRules, matrix=None) -> GraphReport:
    """Rewrite `gm` in place; `kernels_by_op`: the instance's operators; `matrix`: its matrix
    kernels (None without); `namespace`: where its custom operators are registered
    (torch.ops.<namespace>)."""
    graph, report = gm.graph, GraphReport()
    matcher = Matcher(spellings)
    registered = getattr(torch.ops, namespace)
    has_matrix = matrix is not None and bool(matrix.classes)
    for pattern in patterns.patterns:
        if pattern.is_matrix and not has_matrix:
            continue   # an instance without matrix multiplies leaves every linear as it was, unremarked
        outermost = pattern.match.operation
        for node in list(graph.nodes):
            if getattr(node, "_erased", False) or \
                    not any(n.operation.name == outermost for n in spellings.normalize(node)):
                continue
            _try(pattern, node, matcher, kernels_by_op, matrix, rules, spellings, registered, graph, report)
    # a near miss says little where another pattern replaced the node or was declined for a real reason
    decided = {r.node for r in report.replaced} | {d.node for d in report.declined if d.kind != "structure"}
    report.declined = [d for d in report.declined if d.kind != "structure" or d.node not in decided]
    graph.lint()
    gm.recompile()
    report.left = dict(Counter(_name(n, spellings) for n in graph.nodes
                               if n.op in ("call_function", "call_method", "call_module")
                               and not str(n.target).startswith(f"{namespace}.") and not n.meta.get("aicg_adapter")))
    return report


def _name(node: torch.fx.Node, spellings: Spellings) -> str:
    normal = spellings.normalize(node)
    return normal[0].operation.name if normal else target_name(node)


def _try(pattern: Pattern, node, matcher: Matcher, kernels_by_op, matrix, rules, spellings, registered, graph,
         report: GraphReport) -> None:
    matches, failure = matcher.match(pattern, node)
    if not matches:
        if failure is not None and failure.depth >= math.ceil((pattern.size + 1) / 2):
            report.declined.append(Declined(node.name, pattern.name, pattern.operator, "structure", failure.reason))
        return
    first = None
    for match in matches:
        if pattern.is_matrix:
            verdict = contract.check_matrix(pattern, match, node, matrix, spellings)
        else:
            verdict = contract.check(pattern, match, node, kernels_by_op, rules, spellings)
        if verdict.kind is None:
            replace = _replace_matrix if pattern.is_matrix else _replace
            report.replaced.append(replace(pattern, match, node, verdict, registered, graph))
            spellings.forget()   # the replaced node's users now read the operator's result
            return
        first = first or verdict
    report.declined.append(Declined(node.name, pattern.name, pattern.operator, first.kind, first.reason))


def _replace(pattern: Pattern, match: Match, root: torch.fx.Node, verdict: contract.Verdict, registered,
             graph: torch.fx.Graph) -> Replaced:
    op = OPERATORS[pattern.operator]
    args = tuple(match.captures[name] for name in ("x", *op.matrices, *op.vectors))
    kwargs = {name: float(match.captures[name]) for name, _ in op.scalars}
    result_value, root_name = example(root), root.name
    with graph.inserting_before(root):
        call = graph.call_function(getattr(registered, op.name).default, args, kwargs)
        call.meta["example_value"] = result_value.squeeze(-1) if verdict.keepdim else result_value
        result = call
        if verdict.keepdim:   # the graph kept the reduced dimension: give it back
            result = graph.call_function(torch.unsqueeze, (call, -1))
            result.meta["example_value"] = result_value
            result.meta["aicg_adapter"] = True   # ours, not an operation the graph had
    return _swap(pattern, match, root, root_name, result, verdict, graph)


def _replace_matrix(pattern: Pattern, match: Match, root: torch.fx.Node, verdict: contract.Verdict, registered,
                    graph: torch.fx.Graph) -> Replaced:
    """One call of the instance's matmul: act(x @ w.T + b) + r, w passed as its transpose (a view)."""
    activation, has_bias, has_residual = matrix_epilogue(pattern)
    captures = match.captures
    result_value, root_name = example(root), root.name
    with graph.inserting_before(root):
        transposed = graph.call_function(torch.t, (captures["w"],))
        transposed.meta["example_value"] = example(captures["w"]).t()
        transposed.meta["aicg_adapter"] = True   # ours, not an operation the graph had
        call = graph.call_function(registered.matmul.default, (captures["x"], transposed),
                                   {"bias": captures["b"] if has_bias else None,
                                    "residual": captures["r"] if has_residual else None, "activation": activation})
        call.meta["example_value"] = result_value
    return _swap(pattern, match, root, root_name, call, verdict, graph)


def _swap(pattern: Pattern, match: Match, root: torch.fx.Node, root_name: str, result: torch.fx.Node,
          verdict: contract.Verdict, graph: torch.fx.Graph) -> Replaced:
    """`result` where the graph used `root`, and the matched nodes gone; what was replaced."""
    root.replace_all_uses_with(result)
    order = {n: i for i, n in enumerate(graph.nodes)}
    replaced = sorted(set(match.nodes), key=order.__getitem__, reverse=True)   # users before what they use
    for node in replaced:
        graph.erase_node(node)
    x = example(match.captures["x"])
    return Replaced(root_name, pattern.name, pattern.operator, verdict.dtype, tuple(_plain_sizes(x.shape)),
                    tuple(n.name for n in reversed(replaced)))


def _plain_sizes(sizes) -> list:
    return [s if isinstance(s, int) else str(s) for s in sizes]
