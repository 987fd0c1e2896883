"""The template proposer: the planner's candidates, with rule-based repairs.

Offline and deterministic. Without history it proposes the best candidate
by the cost prior. After a failure it repairs by rule:
  compile error or resources (spills, registers) -> the same family with
      fewer threads or a narrower vector;
  wrong results                                   -> a stricter family: one
      that uses fewer transformations;
  far slower than predicted                       -> the next candidate by prior.
A candidate already tried is never proposed again.
"""
from __future__ import annotations

from ..plan import Candidate
from .proposal import Proposal, Request


def _tried(trajectory) -> set[str]:
    return {r["proposal"].get("candidate") for r in trajectory if r.get("proposal")}


def _repairs(last: dict, pool: list[Candidate], families_rules: dict[str, tuple]) -> tuple[list[Candidate], str]:
    outcome, proposal = last["outcome"], last.get("proposal") or {}
    params, family = proposal.get("params", {}), proposal.get("family")
    if outcome in ("compile_error", "resources") and family:
        smaller = [c for c in pool if c.family == family and
                   (c.params["threads"] < params.get("threads", 0) or c.params["vec_bytes"] < params.get("vec_bytes", 0))]
        return smaller, f"repair after {outcome}: {family} with fewer threads or a narrower vector"
    if outcome == "invalid":
        failed_rules = set(families_rules.get(family, proposal.get("declares", ())))
        stricter = sorted((c for c in pool if c.family != family and set(c.rules) <= failed_rules | {"vector_loads"}
                           and len(c.rules) <= len(failed_rules)), key=lambda c: (len(c.rules), c.score))
        return stricter, "repair after wrong results: a stricter family"
    return [], f"after {outcome}: the next candidate by the cost prior"


class TemplateProposer:
    name = "template"

    def __init__(self, pool: list[Candidate], families_rules: dict[str, tuple]):
        self.pool = sorted(pool, key=lambda c: (c.score, c.id))
        self.families_rules = families_rules

    def propose(self, request: Request) -> tuple[Proposal | None, str]:
        tried = _tried(request.trajectory)
        pool = [c for c in self.pool if c.id not in tried]
        preferred, note = [], "the best candidate by the cost prior"
        if request.trajectory:
            preferred, note = _repairs(request.trajectory[-1], pool, self.families_rules)
        choice = (preferred or pool or [None])[0]
        if choice is None:
            return None, "template: every candidate has been tried"
        params = dict(choice.params)
        return Proposal("template", "family", choice.rules, params, choice.family,
                        note=f"{note}: {choice.id}", candidate=choice.id), f"template: {note}"
