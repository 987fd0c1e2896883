"""The memory-bound benchmark's table: printed after the run, written to $AICG_BENCH_JSON."""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

PEERS = ("eager", "compile", "triton")


def _rows(results: dict) -> list[dict]:
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


def pytest_terminal_summary(terminalreporter):
    bench = sys.modules.get("test_memory_bound")   # absent, or skipped, without torch and triton
    rows = _rows(getattr(bench, "RESULTS", {}))
    if not rows:
        return
    write = terminalreporter.write_line
    write("")
    write("case | aicg us | TB/s | of copy | eager/aicg | compile/aicg | triton/aicg | best peer/aicg | "
          "host us aicg/eager | kernel")
    for row in rows:
        ratios = row["peer_over_aicg"]
        cell = lambda k: f"{ratios[k]:.2f}" if k in ratios else "-"  # noqa: E731
        of_copy = f"{row['of_copy'] * 100:.0f}%" if row["of_copy"] is not None else "-"
        best = f"{row['best_peer_over_aicg']:.2f}" if row["best_peer_over_aicg"] else "-"
        hosts = row["host_seconds"]
        host = "/".join(f"{hosts[k] * 1e6:.1f}" if k in hosts else "-" for k in ("aicg", "eager"))
        write(f"{row['suite']} {row['op']}.{row['dtype']} {row['shape'][0]}x{row['shape'][1]} | "
              f"{row['seconds']['aicg'] * 1e6:.1f} | {row['tb_per_s']:.2f} | {of_copy} | {cell('eager')} | "
              f"{cell('compile')} | {cell('triton')} | {best} | {host} | {row['aicg_kernel']}")
    out = os.environ.get("AICG_BENCH_JSON")
    if out:
        import torch
        meta = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(0),
                "torch": torch.__version__}
        Path(out).write_text(json.dumps({**meta, "rows": rows}, indent=1))
