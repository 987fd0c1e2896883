"""The memory-bound benchmark's results as table rows: ratios to the peers and to the copy.

    python tests/bench/bench_table.py bench-acceptance.json     # the Markdown table and summary
"""
from __future__ import annotations

import datetime
import json
import math
import os
import sys
from pathlib import Path

PEERS = ("eager", "compile", "triton")
TIMED = ("aicg", *PEERS, "copy")


def table_rows(results: dict) -> list[dict]:
    rows = []
    for (suite, op, dtype, shape), r in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
        if "aicg" not in r:
            continue
        row = {"suite": suite, "op": op, "dtype": dtype, "shape": list(shape), "bytes": r["bytes"],
               "aicg_kernel": r.get("aicg_kernel"), "aicg_jit": r.get("aicg_jit", []),
               "validation": r.get("aicg_validation"),
               "triton_validation": r.get("triton_validation"),
               "seconds": {k: r[k] for k in TIMED if k in r},
               "host_seconds": {k: r[f"{k}_host"] for k in TIMED if f"{k}_host" in r},
               # every timed round, in order: a median hides two modes (row_sum float32 32768x4096, 2026-12-03)
               "rounds": {k: r[f"{k}_rounds"] for k in TIMED if f"{k}_rounds" in r}}
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


def write_json(results: dict, **meta) -> None:
    out = os.environ.get("AICG_BENCH_JSON")
    if out:
        import torch
        meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
                "torch": torch.__version__, **meta}
        Path(out).write_text(json.dumps({**meta, "rows": table_rows(results)}, indent=1))


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(rows: list[dict]) -> str:
    """The table docs/performance.md shows, then a summary line of counts and geometric means."""
    lines = ["| case | aicg µs | TB/s | % of copy | eager/aicg | compile/aicg | Triton/aicg | best peer/aicg "
             "| host µs aicg / eager | kernel |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        peers, host = r["peer_over_aicg"], r["host_seconds"]
        of_copy = "-" if r["of_copy"] is None else f"{r['of_copy'] * 100:.0f}%"
        lines.append(f"| {r['op']}.{r['dtype']} {r['shape'][0]}×{r['shape'][1]} | {r['seconds']['aicg'] * 1e6:.1f} "
                     f"| {r['tb_per_s']:.2f} | {of_copy} | {_ratio(peers.get('eager'))} | {_ratio(peers.get('compile'))} "
                     f"| {_ratio(peers.get('triton'))} | {_ratio(r['best_peer_over_aicg'])} "
                     f"| {host.get('aicg', 0) * 1e6:.0f} / {host.get('eager', 0) * 1e6:.0f} | `{r['aicg_kernel']}` |")
    at_ceiling = sum(1 for r in rows if r["of_copy"] is not None and r["of_copy"] >= 0.95)
    ahead = sum(1 for r in rows if all(r["peer_over_aicg"].get(k, 0) >= 1.0 for k in ("compile", "triton")))
    validated = sum(1 for r in rows if (r["validation"] or {}).get("passed"))
    near_best = sum(1 for r in rows if r["best_peer_over_aicg"] and r["best_peer_over_aicg"] >= 0.9)
    means = []
    for peer in PEERS:
        values = [r["peer_over_aicg"][peer] for r in rows if peer in r["peer_over_aicg"]]
        if values:
            mean = math.exp(sum(map(math.log, values)) / len(values))
            means.append(f"{peer} {mean:.2f} ({min(values):.2f}-{max(values):.2f})")
    lines += ["", f"{len(rows)} cases: {at_ceiling} at >= 95% of the copy, {ahead} at >= 1.0x both torch.compile and "
                  f"Triton, {validated} validated, {near_best} at >= 0.9x the best peer; geometric mean of "
                  f"peer/aicg: {', '.join(means)}"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(json.loads(Path(sys.argv[1]).read_text())["rows"]))
