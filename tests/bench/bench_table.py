"""The memory-bound benchmark's results as table rows: ratios to the peers and to the copy."""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

PEERS = ("eager", "compile", "triton")


def table_rows(results: dict) -> list[dict]:
    rows = []
    for (suite, op, dtype, shape), r in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
        if "aicg" not in r:
            continue
        row = {"suite": suite, "op": op, "dtype": dtype, "shape": list(shape), "bytes": r["bytes"],
               "aicg_kernel": r.get("aicg_kernel"), "validation": r.get("aicg_validation"),
               "triton_validation": r.get("triton_validation"),
               "seconds": {k: r[k] for k in ("aicg", *PEERS, "copy") if k in r},
               "host_seconds": {k: r[f"{k}_host"] for k in ("aicg", *PEERS, "copy") if f"{k}_host" in r}}
        aicg = r["aicg"]
        row["tb_per_s"] = r["bytes"] / aicg / 1e12
        row["of_copy"] = (r["copy"] / aicg) * (r["bytes"] / (2 * shape[0] * shape[1] * _itemsize(dtype))) if "copy" in r else None
        row["peer_over_aicg"] = {k: r[k] / aicg for k in PEERS if k in r}
        peers = [r[k] for k in PEERS if k in r]
        row["best_peer_over_aicg"] = min(peers) / aicg if peers else None
        rows.append(row)
    return rows


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]


def write_json(results: dict) -> None:
    out = os.environ.get("AICG_BENCH_JSON")
    if out:
        import torch
        meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
                "torch": torch.__version__}
        Path(out).write_text(json.dumps({**meta, "rows": table_rows(results)}, indent=1))
