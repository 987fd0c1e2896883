"""The benchmark's recorded results and the tables in docs/performance.md agree."""
from __future__ import annotations

import importlib.util
import json


def _bench_table(repo):
    spec = importlib.util.spec_from_file_location("bench_table", repo / "tests/bench/bench_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documented_acceptance_table_is_the_recorded_run(repo):
    recorded = json.loads((repo / "docs/bench/2026-12-01-h200-acceptance.json").read_text())
    assert recorded["device"] == "NVIDIA H200" and recorded["date"] == "2026-12-01"
    table = _bench_table(repo).markdown(recorded["rows"])
    assert "20 cases: 10 at >= 95% of the copy, 2 at >= 1.0x both torch.compile and Triton, 20 validated" in table
    docs = (repo / "docs/performance.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "×" in line]
    assert len(rows) == 20 and all(row in docs for row in rows)
