"""The memory-bound benchmark's table: printed after the run (bench_table.write_json
writes it to $AICG_BENCH_JSON after every case, so a run stopped midway keeps what it measured)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_table import table_rows  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    bench = sys.modules.get("test_memory_bound")   # absent, or skipped, without torch and triton
    rows = table_rows(getattr(bench, "RESULTS", {}))
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
