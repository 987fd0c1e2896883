"""Selecting one kernel per operator and dtype, and packaging the instance.

Selection takes the fastest candidate that passed validation (geometric
mean of its measured times over the workload's shapes). A candidate that
failed is never chosen. Where nothing could be validated on this machine,
the best *predicted* candidate is chosen and marked unvalidated, and every
report says so.
"""
from __future__ import annotations

import json
import math

from .. import codegen, digest, toolchain
from ..ops import OPERATORS
from .step import Result, Step
from . import summary


def _geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def select(op: str, dtypes, candidates, results: dict, reports: dict) -> dict:
    out = {"op": op, "dtypes": {}}
    for dtype in dtypes:
        rows = []
        for c in (c for c in candidates if c.dtype == dtype):
            res = results[c.id]
            timings = res.get("timings") or []
            rows.append({"id": c.id, "family": c.family, "params": c.params, "status": res["status"],
                         "reason": res.get("reason"), "predicted_seconds": c.score,
                         "measured_seconds": _geomean([t["median_seconds"] for t in timings]) if timings else None,
                         "resources": reports[c.id]["resources"]})
        passed = [r for r in rows if r["status"] == "passed" and r["measured_seconds"]]
        unvalidated = [r for r in rows if r["status"] == "unvalidated"]
        if passed:
            chosen, basis = min(passed, key=lambda r: (r["measured_seconds"], r["id"])), "fastest measured of the valid candidates"
        elif unvalidated:
            chosen, basis = min(unvalidated, key=lambda r: (r["predicted_seconds"], r["id"])), "best predicted; not validated on the target"
        else:
            chosen, basis = None, ("no candidate passed validation" if rows else "no legal candidate")
        out["dtypes"][dtype] = {"chosen": chosen["id"] if chosen else None,
                                "status": chosen["status"] if chosen else None,
                                "basis": basis, "candidates": rows}
    return out


def package_step(prof, hardware, planned: dict) -> Step:
    """planned: op -> ({dtype: Legality}, [Candidate])."""
    all_candidates = [c for _, cands in planned.values() for c in cands]
    upstream = (f"hw:{hardware.target}", *(f"legality:{op}" for op in planned), *(f"plan:{op}" for op in planned),
                *(f"select:{op}" for op in planned), *(f"compile:{c.id}" for c in all_candidates))
    reads = {"instance": prof.name, "target": hardware.identity(), "preservation": prof.preservation.as_record(),
             "toolchain": toolchain.identity(), "workload": {op: {"dtypes": list(w.dtypes), "shapes": [list(s) for s in w.shapes]}
                                                            for op, w in prof.workload.items()}}

    def run(ctx) -> Result:
        outputs: dict[str, bytes] = {}
        kernels, unavailable = {}, {}
        for op, (legalities, cands) in planned.items():
            by_id = {c.id: c for c in cands}
            selection = json.loads(ctx.upstream(f"select:{op}", f"select/{op}.json"))
            for dtype in prof.workload[op].dtypes:
                legality = legalities[dtype]
                pick = selection["dtypes"][dtype]
                name = f"{op}.{dtype}"
                if pick["chosen"] is None:
                    unavailable[name] = legality.hint or pick["basis"]
                    continue
                cand = by_id[pick["chosen"]]
                cubin = ctx.upstream(f"compile:{cand.id}", f"cubin/{cand.id}.cubin")
                report = json.loads(ctx.upstream(f"compile:{cand.id}", f"cubin/{cand.id}.json"))
                path = f"kernels/{name}.cubin"
                outputs[path] = cubin
                row = next(r for r in pick["candidates"] if r["id"] == cand.id)
                kernels[name] = {
                    "op": op, "dtype": dtype, "candidate": cand.id, "family": cand.family, "params": cand.params,
                    "rules": list(cand.rules), "cubin": path, "cubin_digest": digest.of_bytes(cubin),
                    "entry": codegen.ENTRY, "arguments": OPERATORS[op].argument_names(),
                    "scalars": dict(OPERATORS[op].scalars), "resources": report["resources"],
                    "validation": pick["status"], "basis": pick["basis"],
                    "measured_seconds": row["measured_seconds"], "predicted_seconds": row["predicted_seconds"],
                    "legal_families": legality.legal_families(),
                    "why": {"family": legality.families[cand.family].as_record()["facts"],
                            "rules": {r: legality.rules[r].as_record()["facts"] for r in cand.rules}},
                    "considered": len(pick["candidates"]),
                }
        manifest = {"schema": 1, **reads, "kernels": kernels, "unavailable": unavailable,
                    "inputs": {name: ctx.env.receipt(name)["key"] for name in upstream}}
        outputs["manifest.json"] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        outputs["report.md"] = summary.report(manifest).encode()
        return Result(outputs)

    return Step("package", f"package instance {prof.name}: manifest, report and the chosen cubins", reads, run,
                ("tasks/package.py", "tasks/summary.py", "codegen.py", "ops.py"), upstream=upstream,
                targets=("manifest.json", "report.md"))
