"""The matrix family's part of a packaged instance: manifest.json's "matrix" section and its cubins.

    "matrix": {
      "entry": "aicg_matmul", "arch": "sm_90a", "compute_capability": [9, 0],
      "classes": {"matmul.bfloat16.kk.plain": {
          "dtype", "a_major", "b_major", "epilogue", "shapes", "rtol",
          "chosen", "status", "basis",            # the kernel serving most shapes, for reports
          "dispatch": [{"m", "n", "k", "candidate", "status", "measured_seconds", "predicted_seconds"}],
          "kernels": {<candidate>: {"realisation", "family", "rules", "cubin", "cubin_digest", "resources",
                                    "validation", "validated_on", "measured_seconds", "predicted_seconds"}},
          "legal_families", "rejected", "considered", "why": {"families": {...}, "rules": {...}}}},
      "model_inputs": {<name>: value}}           # the prior's inputs (aicg/matrix/prior.py), for other shapes

Every kernel a dispatch row names is packaged as kernels/matmul/<candidate>.cubin,
with its digest; the runtime (aicg/matrix/dispatch.py) checks it before loading.
"""
from __future__ import annotations

import json

from .. import digest
from . import codegen
from .space import Realisation
from .templates import RULES

OP = "matmul"


def cubin_path(candidate: str) -> str:
    return f"kernels/{OP}/{candidate}.cubin"


def section(ctx, matrix, compute_capability) -> tuple[dict, dict[str, bytes]]:
    """(the manifest's "matrix" section, the cubins it names: path -> bytes), from the published
    legality, plan and selection of `matrix` (aicg/matrix/steps.py's MatrixBuild)."""
    legal = json.loads(ctx.upstream(f"legality:{OP}", f"legality/{OP}.json"))
    plan_record = json.loads(ctx.upstream(f"plan:{OP}", f"plan/{OP}.json"))
    planned = {c["name"]: c for c in plan_record["classes"]}
    selection = json.loads(ctx.upstream(f"select:{OP}", f"select/{OP}.json"))["classes"]
    outputs: dict[str, bytes] = {}
    classes = {}
    for name, pick in selection.items():
        plan = planned[name]
        decided = legal[name]
        by_id = {c["id"]: c for c in plan["candidates"]}
        rows = {r["id"]: r for r in pick["candidates"]}
        kernels = {}
        for cand_id in dict.fromkeys(d["candidate"] for d in pick["dispatch"] if d["candidate"]):
            cubin = ctx.upstream(f"compile:{cand_id}", f"cubin/{cand_id}.cubin")
            path = cubin_path(cand_id)
            outputs[path] = cubin
            row, cand = rows[cand_id], by_id[cand_id]
            real = Realisation.from_dict(cand["realisation"])
            kernels[cand_id] = {"realisation": cand["realisation"], "family": cand["family"], "rules": cand["rules"],
                                "dynamic_shared_bytes": RULES[real.template].dynamic_shared_bytes(real),
                                "cubin": path, "cubin_digest": digest.of_bytes(cubin), "resources": row["resources"],
                                "validation": row["status"], "validated_on": row["validated_on"],
                                "measured_seconds": row["measured_seconds"],
                                "predicted_seconds": row["predicted_seconds"]}
        rules = sorted({r for k in kernels.values() for r in k["rules"]})
        families = decided["legality"]["families"]
        classes[name] = {
            "dtype": plan["dtype"], "a_major": plan["a_major"], "b_major": plan["b_major"],
            "epilogue": plan["epilogue"], "shapes": plan["shapes"], "rtol": plan["rtol"],
            "chosen": pick["chosen"], "status": pick["status"], "basis": pick["basis"],
            "dispatch": pick["dispatch"], "kernels": kernels, "legal_families": decided["usable"],
            "blocked_families": decided["blocked"], "rejected": plan["rejected"], "considered": len(pick["candidates"]),
            "why": {"families": {f: families[f]["facts"] for f in sorted({k["family"] for k in kernels.values()})},
                    "rules": {r: decided["legality"]["rules"][r]["facts"] for r in rules}}}
    return ({"entry": codegen.ENTRY, "arch": matrix.arch, "compute_capability": list(compute_capability),
             "tensor_peak_flops": tensor_peaks(plan_record["inputs"], {c["dtype"] for c in classes.values()}),
             "classes": classes, "model_inputs": {n: i["value"] for n, i in plan_record["inputs"].items()}}, outputs)


def tensor_peaks(inputs: dict, dtypes) -> dict:
    """dtype -> {value, source}: the tensor cores' rate in that dtype, the faster of the instruction
    families the prior reads (wgmma where the GPU has it), as the report divides by it."""
    found = {}
    for dtype in sorted(dtypes):
        rates = [inputs[f"{family}_flops.{dtype}"] for family in ("wgmma", "mma") if f"{family}_flops.{dtype}" in inputs]
        if rates:
            best = max(rates, key=lambda r: r["value"])
            found[dtype] = {"value": best["value"], "source": best["source"]}
    return found


def upstream(matrix) -> tuple[str, ...]:
    return (f"legality:{OP}", f"plan:{OP}", f"select:{OP}", *(f"compile:{c.id}" for c in matrix.candidates))


def optional_outputs(matrix) -> tuple[str, ...]:
    return tuple(cubin_path(c.id) for c in matrix.candidates)
