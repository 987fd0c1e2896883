"""What the backend did to one captured graph: what it replaced, what it left, and why."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Why a pattern that (nearly) matched was not replaced, one word each.
KINDS = {
    "operator": "the instance has no kernels for the operator",
    "structure": "the graph computes something else at this node",
    "device": "not on a CUDA device",
    "dtype": "a dtype the kernels do not take, or a result in another dtype",
    "layout": "rows not evenly spaced, or a vector not contiguous",
    "shape": "shapes outside what the kernels take",
    "scalar": "a scalar argument that is not a number",
    "users": "an intermediate the kernel does not return is used elsewhere",
    "legality": "a rule the pattern needs is not legal at the instance's preservation level",
}


@dataclass(frozen=True)
class Replaced:
    node: str                 # the graph node whose value the instance operator now computes
    pattern: str
    operator: str
    dtype: str
    shape: tuple
    nodes: tuple[str, ...]    # the graph nodes the operator replaced


@dataclass(frozen=True)
class Declined:
    node: str                 # where the pattern was tried
    pattern: str
    operator: str
    kind: str                 # a key of KINDS
    reason: str


@dataclass
class GraphReport:
    replaced: list[Replaced] = field(default_factory=list)
    declined: list[Declined] = field(default_factory=list)
    left: dict[str, int] = field(default_factory=dict)   # operations handed on, by name

    def counts(self) -> dict[str, int]:
        """Instance operators placed in the graph, by operator."""
        return dict(Counter(r.operator for r in self.replaced))

    def as_record(self) -> dict:
        return {"replaced": [vars(r) | {"shape": list(r.shape), "nodes": list(r.nodes)} for r in self.replaced],
                "declined": [vars(d) for d in self.declined], "left": dict(self.left), "counts": self.counts()}

    def text(self) -> str:
        lines = [f"aicg backend: {len(self.replaced)} replaced "
                 f"({', '.join(f'{op} {n}' for op, n in sorted(self.counts().items())) or 'none'}), "
                 f"{len(self.declined)} declined, {sum(self.left.values())} operations left to the next compiler"]
        for r in self.replaced:
            lines.append(f"  replaced {r.node}: {r.operator} ({r.pattern}) in {r.dtype}, x {list(r.shape)}, "
                         f"for {', '.join(r.nodes)}")
        for d in self.declined:
            lines.append(f"  declined {d.node}: {d.pattern} -> {d.operator} [{d.kind}] {d.reason}")
        if self.left:
            lines.append("  left (declined above, or no pattern computes them): " + ", ".join(f"{name} {n}" for name, n in sorted(self.left.items(),
                                                                                 key=lambda kv: (-kv[1], kv[0]))))
        return "\n".join(lines)
