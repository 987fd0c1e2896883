"""The benchmark's recorded results and the tables in docs/performance.md agree."""
from __future__ import annotations

import json

import pytest

from aicg import hw

RECORDED = [   # (run, summary line the table ends with)
    ("2026-12-01-h200-acceptance.json", "20 cases: 10 at >= 95% of the copy, 2 at >= 1.0x both torch.compile "
                                        "and Triton, 20 validated, 20 at >= 0.9x the best peer"),
    ("2026-12-01-h200-acceptance-3.json", "20 cases: 10 at >= 95% of the copy, 4 at >= 1.0x both torch.compile "
                                          "and Triton, 20 validated, 20 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid.json", "100 cases: 10 at >= 95% of the copy, 33 at >= 1.0x both torch.compile "
                                  "and Triton, 100 validated, 58 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid-jit-timed.json", "71 cases: 6 at >= 95% of the copy, 18 at >= 1.0x both "
                                            "torch.compile and Triton, 71 validated, 41 at >= 0.9x the best peer"),
    ("2026-12-01-h200-acceptance-4.json", "14 cases: 7 at >= 95% of the copy, 0 at >= 1.0x both torch.compile "
                                          "and Triton, 14 validated, 14 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid-few-rows-and-tiny.json", "40 cases: 5 at >= 95% of the copy, 7 at >= 1.0x both "
                                                    "torch.compile and Triton, 40 validated, 14 at >= 0.9x the best peer"),
    ("2026-12-01-h200-acceptance-5-before.json", "20 cases: 10 at >= 95% of the copy, 3 at >= 1.0x both "
                                                 "torch.compile and Triton, 20 validated, 20 at >= 0.9x the best peer"),
    ("2026-12-01-h200-acceptance-5.json", "20 cases: 12 at >= 95% of the copy, 2 at >= 1.0x both torch.compile "
                                          "and Triton, 20 validated, 20 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid-5.json", "150 cases: 21 at >= 95% of the copy, 61 at >= 1.0x both torch.compile "
                                    "and Triton, 150 validated, 106 at >= 0.9x the best peer"),
    ("2026-12-01-h200-acceptance-6.json", "24 cases: 12 at >= 95% of the copy, 4 at >= 1.0x both torch.compile "
                                          "and Triton, 24 validated, 23 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid-6-log-softmax-and-one-column.json",
     "45 cases: 4 at >= 95% of the copy, 14 at >= 1.0x both torch.compile and Triton, 45 validated, "
     "26 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid-6-log-softmax-twin-prior.json",
     "9 cases: 0 at >= 95% of the copy, 0 at >= 1.0x both torch.compile and Triton, 9 validated, "
     "4 at >= 0.9x the best peer"),
    ("2026-12-01-h200-acceptance-7.json", "24 cases: 15 at >= 95% of the copy, 6 at >= 1.0x both torch.compile "
                                          "and Triton, 24 validated, 24 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid-7-long-rows.json", "54 cases: 3 at >= 95% of the copy, 24 at >= 1.0x both "
                                              "torch.compile and Triton, 54 validated, 44 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid-7-jit-timing-order.json", "5 cases: 0 at >= 95% of the copy, 2 at >= 1.0x both "
                                                     "torch.compile and Triton, 5 validated, 5 at >= 0.9x the best peer"),
    ("2026-12-01-h200-acceptance-8-fused.json",
     "8 cases: 4 at >= 95% of the copy, 2 at >= 1.0x both torch.compile and Triton, 8 validated, "
     "6 at >= 0.9x the best peer"),
    ("2026-12-01-h200-acceptance-9-fused.json",
     "8 cases: 6 at >= 95% of the copy, 2 at >= 1.0x both torch.compile and Triton, 8 validated, "
     "8 at >= 0.9x the best peer"),
    ("2026-12-01-h200-acceptance-9.json", "24 cases: 15 at >= 95% of the copy, 7 at >= 1.0x both torch.compile "
                                          "and Triton, 24 validated, 24 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid-9-fused.json", "60 cases: 23 at >= 95% of the copy, 27 at >= 1.0x both torch.compile "
                                          "and Triton, 60 validated, 38 at >= 0.9x the best peer"),
    ("2026-12-01-h200-grid-9-fused-long-rows.json",
     "9 cases: 2 at >= 95% of the copy, 3 at >= 1.0x both torch.compile and Triton, 9 validated, "
     "8 at >= 0.9x the best peer"),
    ("2026-12-02-h200-acceptance-10-fused.json", "8 cases: 6 at >= 95% of the copy, 3 at >= 1.0x both "
                                                 "torch.compile and Triton, 8 validated, 8 at >= 0.9x the best peer"),
    ("2026-12-02-h200-grid-10-bias-gelu-residual.json",
     "30 cases: 16 at >= 95% of the copy, 19 at >= 1.0x both torch.compile and Triton, 30 validated, "
     "26 at >= 0.9x the best peer"),
    ("2026-12-02-h200-grid-11-one-element-rows-spills-passed-over.json",
     "24 cases: 2 at >= 95% of the copy, 4 at >= 1.0x both torch.compile and Triton, 24 validated, "
     "8 at >= 0.9x the best peer"),
    ("2026-12-02-h200-grid-11-one-element-rows.json",
     "21 cases: 2 at >= 95% of the copy, 4 at >= 1.0x both torch.compile and Triton, 21 validated, "
     "12 at >= 0.9x the best peer"),
    ("2026-12-02-h200-acceptance-12.json", "24 cases: 16 at >= 95% of the copy, 7 at >= 1.0x both torch.compile "
                                           "and Triton, 24 validated, 24 at >= 0.9x the best peer"),
    ("2026-12-02-h200-acceptance-14.json", "24 cases: 17 at >= 95% of the copy, 7 at >= 1.0x both torch.compile "
                                           "and Triton, 24 validated, 24 at >= 0.9x the best peer"),
    ("2026-12-03-h200-acceptance-15.json", "24 cases: 15 at >= 95% of the copy, 7 at >= 1.0x both torch.compile "
                                           "and Triton, 24 validated, 24 at >= 0.9x the best peer"),
    ("2026-12-03-h200-acceptance-16.json", "24 cases: 19 at >= 95% of the copy, 8 at >= 1.0x both torch.compile "
                                           "and Triton, 24 validated, 23 at >= 0.9x the best peer"),
    ("2026-12-03-h200-acceptance-17.json", "24 cases: 20 at >= 95% of the copy, 7 at >= 1.0x both torch.compile "
                                           "and Triton, 24 validated, 24 at >= 0.9x the best peer"),
    ("2026-12-03-h200-layernorm-float32-prefetch.json", "2 cases: 1 at >= 95% of the copy, 1 at >= 1.0x both "
                                                        "torch.compile and Triton, 2 validated, 2 at >= 0.9x the best peer"),
    ("2026-12-04-h200-acceptance-18.json", "24 cases: 21 at >= 95% of the copy, 7 at >= 1.0x both torch.compile "
                                           "and Triton, 24 validated, 24 at >= 0.9x the best peer"),
    ("2026-12-04-h200-grid-18-norms-float32.json", "20 cases: 6 at >= 95% of the copy, 10 at >= 1.0x both "
                                                   "torch.compile and Triton, 20 validated, 19 at >= 0.9x the best peer"),
    ("2026-12-04-h200-grid-18-norms-bfloat16.json", "20 cases: 6 at >= 95% of the copy, 15 at >= 1.0x both "
                                                    "torch.compile and Triton, 20 validated, 16 at >= 0.9x the best peer"),
    ("2026-12-04-h200-acceptance-19.json", "24 cases: 19 at >= 95% of the copy, 6 at >= 1.0x both torch.compile "
                                           "and Triton, 24 validated, 24 at >= 0.9x the best peer"),
    ("2026-12-04-h200-acceptance-20-norms.json", "8 cases: 6 at >= 95% of the copy, 4 at >= 1.0x both "
                                                 "torch.compile and Triton, 8 validated, 8 at >= 0.9x the best peer"),
    ("2026-12-04-h200-grid-20-norms-latency.json", "8 cases: 4 at >= 95% of the copy, 0 at >= 1.0x both "
                                                   "torch.compile and Triton, 8 validated, 2 at >= 0.9x the best peer"),
    ("2026-12-04-h200-acceptance-21.json", "24 cases: 20 at >= 95% of the copy, 6 at >= 1.0x both torch.compile "
                                           "and Triton, 24 validated, 24 at >= 0.9x the best peer"),
]


@pytest.mark.parametrize("run, summary", RECORDED)
def test_the_documented_tables_are_the_recorded_runs(repo, bench_module, run, summary):
    recorded = json.loads((repo / "docs/bench" / run).read_text())
    assert recorded["device"] == hw.load_target(repo / "hwdb", "nvidia-h200").name and recorded["date"] == run[:len("2026-12-01")]
    table = bench_module("bench_table").markdown(recorded["rows"])
    assert summary in table
    docs = (repo / "docs/performance.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "×" in line]
    assert len(rows) == len(recorded["rows"]) and all(row in docs for row in rows)
