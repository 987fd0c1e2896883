"""Per-shape selection at package time and the runtime's choice of variant (no GPU needed)."""
from __future__ import annotations

from aicg.runtime.instance import nearest_variant
from aicg.tasks.package import _fastest_by_shape


def _row(cid, timings, status="passed"):
    return {"id": cid, "status": status, "timings": [[r, c, t] for r, c, t in timings]}


def test_each_shape_gets_the_candidate_fastest_on_it():
    rows = [_row("wide", [(4096, 32768, 1.0e-3), (65536, 128, 4.0e-4)]),
            _row("narrow", [(4096, 32768, 1.5e-3), (65536, 128, 1.0e-4)]),
            _row("middling", [(4096, 32768, 1.1e-3), (65536, 128, 2.0e-4)])]
    table = _fastest_by_shape(rows)
    assert [(t["rows"], t["cols"], t["candidate"]) for t in table] == [(4096, 32768, "wide"), (65536, 128, "narrow")]
    assert table[1]["measured_seconds"] == 1.0e-4


def test_ties_and_missing_timings_are_decided_deterministically():
    rows = [_row("b", [(10, 10, 1.0)]), _row("a", [(10, 10, 1.0)]), {"id": "c", "status": "passed", "timings": []}]
    assert [t["candidate"] for t in _fastest_by_shape(rows)] == ["a"]
    assert _fastest_by_shape([]) == []


def test_the_runtime_takes_the_variant_of_the_nearest_row_length_then_row_count():
    entry = {"cubin": "kernels/x.cubin", "params": {"threads": 256},
             "dispatch": [{"rows": 4096, "cols": 32768, "cubin": "a", "params": {"threads": 1024}},
                          {"rows": 65536, "cols": 128, "cubin": "b", "params": {"threads": 128}},
                          {"rows": 256, "cols": 8192, "cubin": "c", "params": {"threads": 512}},
                          {"rows": 32768, "cols": 8192, "cubin": "d", "params": {"threads": 256}}]}
    assert nearest_variant(entry, 10, 100)["cubin"] == "b"
    assert nearest_variant(entry, 100_000, 60_000)["cubin"] == "a"
    assert nearest_variant(entry, 300, 8000)["cubin"] == "c"
    assert nearest_variant(entry, 20_000, 8192)["cubin"] == "d"


def test_without_a_table_the_operator_kernel_serves_every_shape():
    entry = {"cubin": "kernels/x.cubin", "params": {"threads": 256}, "dispatch": []}
    assert nearest_variant(entry, 5, 5) is entry
    assert nearest_variant({"cubin": "k", "params": {}}, 5, 5)["cubin"] == "k"
