"""One round of the repair loop, and the chain of rounds as steps.

A round asks the proposers in order until one proposes, checks the proposal
(legality of what it declares, what its source reveals), compiles it,
validates it on the target and compares its time with the prediction. The
outcome and a feedback line join the trajectory; the next round sends the
trajectory to the proposers. Once a round is accepted, later rounds carry
it forward unchanged. Without the target GPU a round cannot be judged: it
ends the chain as "unvalidated" and is not cached.
"""
from __future__ import annotations

import json

from .. import nvrtc
from ..errors import CompileError
from ..plan import Candidate
from ..semantics.legality import decide_rule
from ..tasks.step import Result, Step
from . import proposal as proposals

SLOW_FACTOR = 3.0           # measured over predicted beyond which a kernel is "far below the prediction"
MAX_REGISTERS = 255
FINAL = {"accepted", "unvalidated", "exhausted"}


def _to_json(value) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


def _outcome(record: dict, outcome: str, feedback: str, **extra) -> dict:
    return {**record, "outcome": outcome, "feedback": feedback, **extra}


def run_round(k: int, trajectory: list, proposers, ruleset, prof, op: str, dtype: str, hardware,
              kernels_dir, validate, planned: dict[str, Candidate]) -> tuple[list, bytes | None, bool]:
    """(trajectory, cubin or None, cacheable) after round k; `validate(cubin, params, longest_row)`
    judges a kernel, on rows of at most the longest a planned candidate's order keeps the bound on
    (every check shape for any other proposal)."""
    request = proposals.Request(op, dtype, k, tuple(legal_rules(ruleset, prof, op, dtype)), tuple(trajectory))
    notes, proposal = [], None
    for proposer in proposers:
        proposal, note = proposer.propose(request)
        notes.append(note)
        if proposal is not None:
            break
    record = {"round": k, "notes": notes, "proposal": proposal.as_record() if proposal else None}
    if proposal is None:
        return trajectory + [_outcome(record, "exhausted", "no proposer had a proposal")], None, True

    reasons = proposals.check(proposal, op, dtype, ruleset, prof.preservation, prof.choice)
    if reasons:
        return trajectory + [_outcome(record, "rejected", "rejected before compiling: " + "; ".join(reasons))], None, True

    label = proposal.candidate or f"{op}.{dtype}.round{k}"
    source, main = proposals.render(proposal, op, dtype, ruleset, label)
    headers = {}
    for header in proposals.headers_for(proposal, main):
        headers.update(nvrtc.include_closure(header, kernels_dir))
    try:
        cubin, resources, _ = nvrtc.compile_cubin(source, f"synth/{op}.{dtype}.{k}.cu", headers, hardware.arch)
    except CompileError as err:
        log = str(err).splitlines()
        return trajectory + [_outcome(record, "compile_error", "NVRTC: " + " | ".join(log[1:8]), source=source)], None, True
    record.update(source=source, resources=resources)
    spills = resources["spill_store_bytes"] + resources["spill_load_bytes"]
    if spills or resources["registers"] > MAX_REGISTERS:
        return trajectory + [_outcome(record, "resources", f"{resources['registers']} registers, {spills} bytes spilled")], cubin, True

    known = planned.get(proposal.candidate or "")
    result = validate(cubin, proposal.params, known.longest_row if known else None)
    record["longest_row"] = known.longest_row if known else None
    record["validation"] = {k2: result.get(k2) for k2 in ("status", "reason", "timings", "implausibly_fast")}
    if result["status"] == "unvalidated":
        return trajectory + [_outcome(record, "unvalidated", result.get("reason", ""))], cubin, False
    if result["status"] != "passed":
        bad = [c for c in result.get("checks", []) if not c["passed"]][:3]
        stats = "; ".join(f"shape {c['shape']}: error/bound {c['worst_error_over_bound']:.3g}, unwritten {c['unwritten']}, "
                          f"repeatable {c['repeatable']}, inputs intact {c['input_intact']}" for c in bad)
        if result.get("implausibly_fast"):
            stats += f"; implausibly fast on {result['implausibly_fast']}"
        return trajectory + [_outcome(record, "invalid", "validation failed: " + stats)], cubin, True
    measured = sum(t["median_seconds"] for t in result["timings"]) / max(1, len(result["timings"]))
    expected = known.score if known else None
    if expected and measured > SLOW_FACTOR * expected:
        return trajectory + [_outcome(record, "slow", f"{measured * 1e6:.1f} us against {expected * 1e6:.1f} us predicted",
                                      measured_seconds=measured)], cubin, True
    return trajectory + [_outcome(record, "accepted", "valid", measured_seconds=measured)], cubin, True


def legal_rules(ruleset, prof, op, dtype) -> list[str]:
    return [name for name, rule in ruleset.rules.items()
            if decide_rule(rule, ruleset.ops[op], dtype, ruleset, prof.preservation, prof.choice).legal]


def round_steps(op: str, dtype: str, prof, ruleset, hardware, layout, make_proposers, validate,
                pool: list[Candidate], code: tuple[str, ...], reads: dict) -> list[Step]:
    """The chain synth:<op>.<dtype>.0 .. .{rounds-1}; each round reads the one before."""
    steps = []
    planned = {c.id: c for c in pool}
    for k in range(prof.synthesis.rounds):
        name = f"synth:{op}.{dtype}.{k}"
        out, cubin_out = f"synth/{op}.{dtype}.{k}.json", f"synth/{op}.{dtype}.{k}.cubin"
        previous = f"synth:{op}.{dtype}.{k - 1}" if k else None

        def run(ctx, k=k, previous=previous, out=out, cubin_out=cubin_out) -> Result:
            trajectory, cubin = [], None
            if previous:
                prev_out, prev_cubin = f"synth/{op}.{dtype}.{k - 1}.json", f"synth/{op}.{dtype}.{k - 1}.cubin"
                trajectory = json.loads(ctx.upstream(previous, prev_out))
                receipt = ctx.env.receipt(previous)
                cubin = ctx.upstream(previous, prev_cubin) if prev_cubin in receipt["outputs"] else None
            if trajectory and trajectory[-1]["outcome"] in FINAL:
                outputs = {out: _to_json(trajectory)}
                if cubin is not None:
                    outputs[cubin_out] = cubin
                return Result(outputs, cache=trajectory[-1]["outcome"] != "unvalidated")
            trajectory, cubin, cacheable = run_round(k, trajectory, make_proposers(ctx.env), ruleset, prof,
                                                     op, dtype, hardware, layout.kernels, validate, planned)
            outputs = {out: _to_json(trajectory)}
            if cubin is not None and trajectory[-1]["outcome"] == "accepted":
                outputs[cubin_out] = cubin
            return Result(outputs, cache=cacheable)

        steps.append(Step(name, f"synthesis round {k} for {op} in {dtype}", {**reads, "round": k}, run, code,
                          upstream=((previous,) if previous else ()) + (f"legality:{op}",), targets=(out,),
                          optional_outputs=(cubin_out,), role="evidence"))
    return steps
