"""Selecting one kernel per operator and dtype, and packaging the instance.

Selection takes the fastest candidate that passed validation (geometric
mean of its measured times over the workload's shapes) as the operator's
kernel, and records for every workload shape the valid candidate fastest on
it; the package carries those too, and the runtime dispatches on the shape. A candidate that
failed is never chosen. A pass counts only from trusted evidence (aicg/trust.py):
one an unsigned remote reports is "unverified", chosen only where nothing
trusted passed, and marked so. Where nothing could be validated on this machine,
the best *predicted* candidate is chosen and marked unvalidated, and every
report says so.
"""
from __future__ import annotations

import json
import math

from .. import codegen, digest, toolchain
from ..matrix import package as matrix_package
from ..matrix import summary as matrix_summary
from ..primitives import realisation
from ..ops import OPERATORS
from ..semantics.legality import decide_rule
from .step import Result, Step
from . import summary


def _geomean(values) -> float:
    return _portable(math.exp(sum(math.log(v) for v in values) / len(values)))


def _portable(seconds: float) -> float:
    """Seconds to 9 significant digits: math.log and math.exp may differ in their last bit between
    machines (a build on a machine without a GPU, reading the record, and the GPU's own build must
    write the same manifest), and no decision rests on a difference that small."""
    return float(f"{seconds:.9g}")


def _synthesized_row(op: str, dtype: str, trajectory: list) -> dict | None:
    """The synthesis loop's result as one more candidate, if its last round was accepted."""
    last = trajectory[-1] if trajectory else None
    if not last or last["outcome"] != "accepted":
        return None
    proposal, timings = last["proposal"], last["validation"]["timings"]
    return {"id": f"synth:{op}.{dtype}", "family": proposal.get("family") or f"proposal ({proposal['proposer']})",
            "params": proposal["params"], "status": "passed", "reason": None, "predicted_seconds": None, "prior": None,
            "measured_seconds": _geomean([t["median_seconds"] for t in timings]),
            "resources": last["resources"], "round": last["round"], "validated_on": last["validation"].get("device")}


UNSIGNED_EVIDENCE = "its validation came from an unsigned remote store, which is not trusted without a signing key"


def _status(res: dict) -> tuple[str, str | None]:
    """A validation record's verdict, (status, reason): a pass must hold checks that all passed and
    timings that are positive numbers, whatever the record says (a record of zero trials is no pass)."""
    status, reason = res.get("status"), res.get("reason")
    if status != "passed":
        return (status if status in ("failed", "unvalidated") else "failed"), reason
    checks, timings = res.get("checks") or [], res.get("timings") or []
    if not checks or not all(c.get("passed") is True for c in checks):
        return "failed", "its validation record holds no passing checks"
    if not timings or not all(isinstance(t.get("median_seconds"), (int, float)) and t["median_seconds"] > 0
                              and math.isfinite(t["median_seconds"]) for t in timings):
        return "failed", "its validation record holds no valid timings"
    return "passed", reason


def select(op: str, dtypes, candidates, results: dict, reports: dict, trajectories: dict | None = None,
           untrusted: set[str] = frozenset()) -> dict:
    """untrusted: ids of candidates (and "synth:<op>.<dtype>") whose validation is not trusted evidence."""
    out = {"op": op, "dtypes": {}}
    for dtype in dtypes:
        rows = []
        synthesized = _synthesized_row(op, dtype, (trajectories or {}).get(dtype, []))
        for c in (c for c in candidates if c.dtype == dtype):
            res = results[c.id]
            status, reason = _status(res)
            timings = res.get("timings") or []
            rows.append({"id": c.id, "family": c.family, "params": c.params, "status": status,
                         "reason": reason, "prior": c.prior,
                         "predicted_seconds": _portable(c.score) if math.isfinite(c.score) else None,   # None: serves some shapes
                         "measured_seconds": _geomean([t["median_seconds"] for t in timings]) if timings else None,
                         "timings": [[*t["shape"], t["median_seconds"]] for t in timings],
                         "validated_on": res.get("device") if status == "passed" else None,
                         "resources": reports[c.id]["resources"]})
        rows += [synthesized] if synthesized else []
        for r in rows:
            if r["status"] == "passed" and r["id"] in untrusted:
                r["status"], r["reason"] = "unverified", UNSIGNED_EVIDENCE
        passed = [r for r in rows if r["status"] == "passed" and r["measured_seconds"]]
        unverified = [r for r in rows if r["status"] == "unverified" and r["measured_seconds"]]
        unvalidated = [r for r in rows if r["status"] == "unvalidated"]
        # The operator's kernel is timed at every shape any valid candidate was: one that serves
        # only some (its order keeps the bound on shorter rows) is a variant for those alone.
        # (Synthesis's row carries no per-shape timings: its proposal was timed at every shape.)
        everywhere = set().union(*(_timed_shapes(r) for r in passed))
        whole = [r for r in passed if "timings" not in r or _timed_shapes(r) == everywhere] or passed
        if passed:
            chosen, basis = min(whole, key=lambda r: (r["measured_seconds"], r["id"])), "fastest measured of the valid candidates"
        elif unverified:
            chosen, basis = (min(unverified, key=lambda r: (r["measured_seconds"], r["id"])),
                             "fastest measured by an unsigned remote store; not verified")
        elif unvalidated:
            chosen, basis = (min(unvalidated, key=lambda r: (r["predicted_seconds"] is None, r["predicted_seconds"] or 0.0, r["id"])),
                             "best predicted; not validated on the target")
        else:
            chosen, basis = None, ("no candidate passed validation" if rows else "no legal candidate")
        if trajectories and dtype in trajectories:
            out.setdefault("synthesis", {})[dtype] = trajectories[dtype]
        out["dtypes"][dtype] = {"chosen": chosen["id"] if chosen else None,
                                "status": chosen["status"] if chosen else None,
                                "basis": basis, "candidates": rows, "by_shape": _fastest_by_shape(passed)}
    return out


def _timed_shapes(row: dict) -> set:
    return {(rows, cols) for rows, cols, _ in row.get("timings") or []}


def _fastest_by_shape(passed: list[dict]) -> list[dict]:
    """For every timed workload shape, the valid planned candidate fastest on it: one kernel
    rarely wins every shape, and the runtime dispatches on the shape of each call."""
    timed = [r for r in passed if r.get("timings")]
    shapes = {(rows, cols) for r in timed for rows, cols, _ in r["timings"]}
    out = []
    for shape in sorted(shapes):
        best = min(((next(t for *s, t in r["timings"] if tuple(s) == shape), r["id"]) for r in timed
                    if any(tuple(s) == shape for *s, _ in r["timings"])))
        out.append({"rows": shape[0], "cols": shape[1], "candidate": best[1], "measured_seconds": best[0]})
    return out


def _chosen_kernel(ctx, prof, ruleset, op: str, dtype: str, pick: dict, by_id: dict, legality) -> tuple[bytes, dict]:
    """(cubin, manifest fields) of the chosen candidate: a planned one or the synthesis loop's."""
    row = next(r for r in pick["candidates"] if r["id"] == pick["chosen"])
    if pick["chosen"].startswith("synth:"):
        last = prof.synthesis.rounds - 1
        trajectory = json.loads(ctx.upstream(f"synth:{op}.{dtype}.{last}", f"synth/{op}.{dtype}.{last}.json"))
        cubin = ctx.upstream(f"synth:{op}.{dtype}.{last}", f"synth/{op}.{dtype}.{last}.cubin")
        proposal = trajectory[-1]["proposal"]
        why = {r: decide_rule(ruleset.rules[r], ruleset.ops[op], dtype, ruleset, prof.preservation,
                              prof.choice).as_record()["facts"] for r in proposal["declares"]}
        return cubin, {"candidate": pick["chosen"], "family": row["family"], "params": proposal["params"],
                       "rules": proposal["declares"], "resources": row["resources"],
                       "longest_row": trajectory[-1].get("longest_row"),
                       "why": {"family": [{"text": f"proposed by {proposal['proposer']} in round {trajectory[-1]['round']}, "
                                                   f"checked, compiled and validated like any candidate"}], "rules": why}}
    cand = by_id[pick["chosen"]]
    report = json.loads(ctx.upstream(f"compile:{cand.id}", f"cubin/{cand.id}.json"))
    return ctx.upstream(f"compile:{cand.id}", f"cubin/{cand.id}.cubin"), {
        "candidate": cand.id, "family": cand.family, "params": cand.params, "rules": list(cand.rules),
        "resources": report["resources"], "longest_row": cand.longest_row,
        "why": {"family": legality.families[cand.family].as_record()["facts"],
                "rules": {r: legality.rules[r].as_record()["facts"] for r in cand.rules}}}


def _prior_record(prof, snapshot: dict[str, bytes]) -> dict | None:
    """The realisation profile that calibrated the plan, and the kernel headers changed since it
    measured them (None: the profile does not say which it measured)."""
    data = snapshot.get(f"source/hwdb/{prof.target}.realisation.json")
    if data is None or prof.prior != "measured":
        return None
    provenance = json.loads(data)["provenance"]
    headers = {path.rsplit("/", 1)[1]: b for path, b in snapshot.items()
               if path.startswith("source/kernels/") and path.count("/") == 2}   # the row families' own
    return {"profile": f"{prof.target}.realisation.json", "device": provenance["device"], "date": provenance["date"],
            "kernels_changed": realisation.kernels_changed(provenance, headers)}


def package_step(prof, hardware, planned: dict, ruleset, snapshot: dict[str, bytes], matrix=None) -> Step:
    """planned: op -> ({dtype: Legality}, [Candidate]); snapshot: the planning inputs the
    instance carries for its JIT (source/...), path -> bytes; matrix: the profile's matrix classes
    as planned (aicg/matrix/steps.py), or None where it has none (nothing of the manifest changes then)."""
    all_candidates = [c for _, cands in planned.values() for c in cands]
    rounds = [f"synth:{op}.{d}.{prof.synthesis.rounds - 1}" for op in planned for d in prof.workload[op].dtypes
              if planned[op][0][d].legal_families()] if prof.synthesis else []
    upstream = (f"hw:{hardware.target}", *(f"legality:{op}" for op in planned), *(f"plan:{op}" for op in planned),
                *(f"select:{op}" for op in planned), *(f"compile:{c.id}" for c in all_candidates), *rounds,
                *(matrix_package.upstream(matrix) if matrix else ()))
    reads = {"instance": prof.name, "target": hardware.identity(), "preservation": prof.preservation.as_record(),
             "toolchain": toolchain.identity(), "workload": {op: {"dtypes": list(w.dtypes), "shapes": [list(s) for s in w.shapes]}
                                                            for op, w in prof.workload.items()},
             "source": {path: digest.of_bytes(data) for path, data in sorted(snapshot.items())}}
    if matrix:
        reads["matmul"] = [c.as_record() for c in matrix.classes]

    def run(ctx) -> Result:
        outputs: dict[str, bytes] = dict(snapshot)
        kernels, unavailable, synthesis = {}, {}, {}
        for op, (legalities, cands) in planned.items():
            by_id = {c.id: c for c in cands}
            selection = json.loads(ctx.upstream(f"select:{op}", f"select/{op}.json"))
            for dtype in prof.workload[op].dtypes:
                legality = legalities[dtype]
                pick = selection["dtypes"][dtype]
                name = f"{op}.{dtype}"
                if dtype in selection.get("synthesis", {}):
                    synthesis[name] = selection["synthesis"][dtype]
                if pick["chosen"] is None:
                    unavailable[name] = legality.hint or pick["basis"]
                    continue
                cubin, fields = _chosen_kernel(ctx, prof, ruleset, op, dtype, pick, by_id, legality)
                path = f"kernels/{name}.cubin"
                outputs[path] = cubin
                row = next(r for r in pick["candidates"] if r["id"] == pick["chosen"])
                dispatch = []
                for choice in pick.get("by_shape", []):
                    cand_id = choice["candidate"]
                    if cand_id == pick["chosen"]:
                        variant_path, variant_cubin, params = path, cubin, fields["params"]
                    else:
                        variant_path = f"kernels/{name}.{cand_id}.cubin"
                        variant_cubin = ctx.upstream(f"compile:{cand_id}", f"cubin/{cand_id}.cubin")
                        params = by_id[cand_id].params
                        outputs[variant_path] = variant_cubin
                    dispatch.append({**choice, "params": params, "cubin": variant_path,
                                     "cubin_digest": digest.of_bytes(variant_cubin),
                                     "longest_row": by_id[cand_id].longest_row if cand_id in by_id else None})
                kernels[name] = {
                    "op": op, "dtype": dtype, **fields, "cubin": path, "cubin_digest": digest.of_bytes(cubin),
                    "dispatch": dispatch,
                    "entry": codegen.ENTRY, "arguments": OPERATORS[op].argument_names(),
                    "scalars": dict(OPERATORS[op].scalars),
                    "validation": pick["status"], "basis": pick["basis"], "validated_on": row.get("validated_on"),
                    "measured_seconds": row["measured_seconds"], "predicted_seconds": row["predicted_seconds"],
                    "prior": row["prior"],
                    "legal_families": legality.legal_families(), "considered": len(pick["candidates"]),
                }
        manifest = {"schema": 1, **reads, "kernels": kernels, "unavailable": unavailable, "synthesis": synthesis,
                    "prior": _prior_record(prof, snapshot),
                    "inputs": {name: ctx.env.receipt(name)["key"] for name in upstream}}
        if matrix:
            manifest["matrix"], cubins = matrix_package.section(ctx, matrix, hardware.compute_capability)
            outputs.update(cubins)
        outputs["manifest.json"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        outputs["report.md"] = (summary.report(manifest) + matrix_summary.report(manifest)).encode()
        return Result(outputs)

    kernel_files = [f"kernels/{op}.{dtype}.cubin" for op in planned for dtype in prof.workload[op].dtypes]
    kernel_files += [f"kernels/{c.op}.{c.dtype}.{c.id}.cubin" for c in all_candidates]
    kernel_files += list(matrix_package.optional_outputs(matrix)) if matrix else []
    code = ("tasks/package.py", "tasks/summary.py", "codegen.py", "ops.py", "primitives/realisation.py")
    if matrix:   # only then: an instance without matrix multiplies keeps the keys it always had
        code += ("matrix/package.py", "matrix/summary.py")
    return Step("package", f"package instance {prof.name}: manifest, report and the chosen cubins", reads, run,
                code,
                upstream=upstream,
                targets=("manifest.json", "report.md", *sorted(snapshot)), optional_outputs=tuple(kernel_files),
                role="verdict", signed=("manifest.json",))
