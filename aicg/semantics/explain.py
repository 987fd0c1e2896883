"""`doit explain`: the legality of an operator, per dtype, as a person reads it."""
from __future__ import annotations

from .legality import Decision, Legality, Preservation

MARK = {True: "+", False: "-"}


def _decision_lines(name: str, decision: Decision, summary: str, indent: str) -> list[str]:
    lines = [f"{indent}{MARK[decision.legal]} {name}" + (f": {summary}" if summary else "")]
    lines += [f"{indent}    {'ok ' if f.ok else 'NO '} {f.text()}" for f in decision.facts]
    return lines


def _trajectory_lines(trajectory: list) -> list[str]:
    lines = ["  synthesis:"]
    for record in trajectory:
        p = record.get("proposal") or {}
        what = p.get("candidate") or (f"{p.get('kind')} proposal" if p else "no proposal")
        lines.append(f"    round {record['round']} ({p.get('proposer', '-')}, {what}): {record['outcome']}"
                     + (f" - {record['feedback']}" if record.get("feedback") else ""))
        lines += [f"        {note}" for note in record.get("notes", [])]
    return lines


def explain(legalities: dict[str, Legality], ruleset, pres: Preservation, chosen: dict | None = None,
            trajectories: dict | None = None) -> str:
    """Text for one operator: legalities maps dtype -> Legality; chosen maps dtype -> manifest entry;
    trajectories maps dtype -> the synthesis loop's rounds."""
    first = next(iter(legalities.values()))
    op = ruleset.ops[first.op]
    axes = ", ".join(f"{k} = {v!r}" for k, v in sorted(pres.axes.items()))
    lines = [f"{op.name}: {op.form}", f"preservation: preset {pres.preset!r} ({axes})"]
    for dtype, legality in legalities.items():
        rtol, atol = pres.tolerance[dtype]
        lines += ["", f"{op.name} in {dtype} (rtol {rtol:g}, atol {atol:g})", "  families:"]
        for name, decision in legality.families.items():
            lines += _decision_lines(name, decision, ruleset.families[name].summary, "    ")
        if not legality.families:
            lines.append("    (none)")
        lines.append("  rules:")
        for name, decision in legality.rules.items():
            lines += _decision_lines(name, decision, "", "    ")
        if legality.hint:
            lines += ["  hint:", f"    {legality.hint}"]
        if (trajectories or {}).get(dtype):
            lines += _trajectory_lines(trajectories[dtype])
        entry = (chosen or {}).get(dtype)
        if entry:
            time = f", {entry['measured_seconds'] * 1e6:.1f} us" if entry.get("measured_seconds") else ""
            lines.append(f"  chosen in the built instance: {entry['candidate']} ({entry['validation']}{time}; {entry['basis']})")
            if entry.get("longest_row") is not None:
                lines.append(f"    its order keeps rtol {rtol:g} on rows of at most {entry['longest_row']} elements "
                             f"(rounding bound, {ruleset.rounding.ref}); longer rows go to the JIT")
            if entry.get("predicted_seconds"):
                lines.append(f"    ranked by the {entry.get('prior') or 'datasheet model'}: predicted "
                             f"{entry['predicted_seconds'] * 1e6:.1f} us (geometric mean over the workload's shapes)")
    return "\n".join(lines) + "\n"
