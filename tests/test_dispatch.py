"""Per-shape selection at package time and the runtime's choice of variant (no GPU needed)."""
from __future__ import annotations

from aicg.runtime.instance import nearest_variant
from aicg.tasks.package import _fastest_by_shape
from doit_project import doit, make_project, profile_text


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


TWO_SHAPES = profile_text(ops=("softmax",), shapes=((64, 1000), (4096, 128)))


def test_a_built_instance_carries_the_fastest_kernel_of_each_shape(tmp_path):
    """Validations found in the store (as a GPU node leaves them) with per-shape timings that
    disagree: the manifest names a kernel per shape, and packs each one's cubin."""
    import json
    import shutil

    from aicg import cas, digest
    from aicg.tasks import graph, step

    project = make_project(tmp_path / "proj", TWO_SHAPES)
    assert doit(project, "build", "profile=rulesets/profiles/small.toml").code == 0
    instance = graph.load_instance(graph.Layout(project), project / "rulesets/profiles/small.toml", project / "build")
    validates = [s for s in instance.steps if s.name.startswith("validate:")][:2]
    local = instance.env.store.local
    for i, validate in enumerate(validates):
        fast, slow = (1e-6, 9e-6) if i == 0 else (9e-6, 1e-6)   # the first wins the first shape, the second the other
        record = {"status": "passed", "device": "NVIDIA H200", "checks": [{"trial": 0, "passed": True}],
                  "timings": [{"shape": [64, 1000], "median_seconds": fast},
                              {"shape": [4096, 128], "median_seconds": slow}]}
        out = validate.targets[0]
        local.put_action(cas.ActionEntry(step.key(validate, instance.env), "validate",
                                         {out: local.put_blob(graph.to_json(record))}))
    shutil.rmtree(project / "build")
    assert doit(project, "build", "profile=rulesets/profiles/small.toml").code == 0
    root = project / "build/small"
    entry = json.loads((root / "manifest.json").read_text())["kernels"]["softmax.float32"]
    names = [v.name.split(":", 1)[1] for v in validates]
    assert [(v["rows"], v["cols"], v["candidate"]) for v in entry["dispatch"]] == [(64, 1000, names[0]),
                                                                                   (4096, 128, names[1])]
    for variant in entry["dispatch"]:
        assert digest.of_bytes((root / variant["cubin"]).read_bytes()) == variant["cubin_digest"]
    assert nearest_variant(entry, 100, 900)["candidate"] == names[0]
    assert nearest_variant(entry, 10_000, 100)["candidate"] == names[1]
