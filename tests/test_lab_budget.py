"""The budgeted lab (doit primitives budget=...) on the recorded H200 profile, with no GPU: its order,
its resume, and how close an instance planned on what a budget measures comes to one planned on the
full profile (aicg/primitives/replay.py; the table for several budgets is in docs/lab.md)."""
from __future__ import annotations

import json
import math

import pytest

from aicg import plan
from aicg.errors import InputError
from aicg.primitives import budget, cost, lab, priority, realisation, replay
from aicg.tasks import probe_tasks

BUDGET = 150.0   # seconds: the CI run of the replay (docs/lab.md has the others)


@pytest.fixture(scope="module")
def setup(repo) -> replay.Setup:
    return replay.setup(repo, "nvidia-h200")


@pytest.fixture(scope="module")
def run(setup) -> budget.Run:
    return replay.simulate(setup, BUDGET)


def _config(setup, config_id: str) -> lab.Config:
    return next(c for c in setup.configs if c.id == config_id)


def test_a_shape_bears_on_the_row_lengths_the_prior_interpolates_it_between(setup):
    block = _config(setup, "softmax_twopass.float32.t512.v16.block.c8")
    assert priority.bears_on(block, 1000) == (512, 4096)
    assert priority.bears_on(block, 4096) == (4096,)
    assert priority.bears_on(block, 20) == (64,) and priority.bears_on(block, 65536) == (32768,)
    eight = _config(setup, "rmsnorm_tree.bfloat16.t128.v16.thread_rows8")   # tiny rows take a path of their own
    assert priority.bears_on(eight, 3) == (1, 4) and priority.bears_on(eight, 100) == (64, 512)
    assert priority.bears_on(eight, 10) == (64,)
    thread = _config(setup, "rmsnorm_tree.bfloat16.t128.v16.thread")        # one path: 4 and 64 around 10
    assert priority.bears_on(thread, 10) == (4, 64)
    flat = next(c for c in setup.configs if c.params["topology"] == "flat")  # read by element count
    assert priority.bears_on(flat, 1000) == lab.row_lengths(flat)


def test_the_decisions_are_the_shipped_profiles_shapes_their_families_overall_and_the_lab_grid(setup):
    by_tier = {t: [d for d in setup.decisions if d.tier == t] for t in (priority.PROFILES, priority.GRID)}
    shapes = {tuple(s) for p in setup.profiles for w in p.workload.values() for s in w.shapes}
    assert {d.shapes[0] for d in by_tier[priority.PROFILES] if len(d.shapes) == 1} == shapes
    overall = [d for d in by_tier[priority.PROFILES] if len(d.shapes) > 1]
    assert overall and all(len({c.family for c in d.members}) == 1 for d in overall)
    # float16 is measured as bfloat16: its decisions are those of bfloat16, once
    assert all(c.dtype in lab.DTYPES_MEASURED for d in setup.decisions for c in d.members)
    assert len({(d.shapes, tuple(c.id for c in d.members)) for d in setup.decisions}) == len(setup.decisions)
    grid = {(c.family, c.dtype, d.shapes[0]) for d in by_tier[priority.GRID] for c in d.members}
    assert grid == {(c.family, c.dtype, (rows, cols)) for c in setup.configs
                    for cols in lab.row_lengths(c) for rows in lab.launches(cols)}


def test_the_order_is_a_pure_function_of_what_is_measured(setup):
    done = {(r["id"], r["cols"]) for r in setup.full.records if r["family"] == "row_max_tree"}
    records = [r for r in setup.full.records if (r["id"], r["cols"]) in done]

    def ordered():
        estimates = priority.Estimates(setup.ruleset, setup.hw, budget.prior_of(records, setup.hw, {"device": "d", "date": "d"}))
        return [(item.key, u) for item, u in priority.order(priority.pending(list(setup.configs), done),
                                                            list(setup.decisions), estimates, done)]
    first = ordered()
    assert first == ordered()
    assert len(first) == sum(len(lab.row_lengths(c)) for c in setup.configs) - len(done)
    assert not {key for key, _ in first} & done


def test_before_anything_is_measured_each_decisions_predicted_leader_comes_first(setup):
    """On a GPU the lab has never measured, the model alone ranks: the leader of every decision of a
    shipped profile is urgent (its optimistic time beats the best prediction), and every item that
    may change such a decision goes before every one that may not."""
    estimates = priority.Estimates(setup.ruleset, setup.hw)
    items = priority.pending(list(setup.configs), set())
    urgency = priority.urgencies(items, list(setup.decisions), estimates, set())
    for d in setup.decisions:
        if d.tier == priority.PROFILES and len(d.shapes) == 1:
            leader = min(d.members, key=lambda c: (estimates.seconds(c, d.shapes[0]), c.id))
            for n in priority.bears_on(leader, d.shapes[0][1]):
                assert urgency[leader.id, n][priority.PROFILES] <= math.exp(-priority.SPREAD["model"]) * (1 + 1e-12)
    ordered = [item.key for item, _ in priority.order(items, list(setup.decisions), estimates, set())]
    profile_urgent = [k for k in ordered if urgency[k][priority.PROFILES] < 1]
    assert ordered[:len(profile_urgent)] == profile_urgent
    grid_next = [k for k in ordered[len(profile_urgent):] if urgency[k][priority.GRID] < 1]
    assert ordered[len(profile_urgent):len(profile_urgent) + len(grid_next)] == grid_next
    assert 0 < len(profile_urgent) < len(ordered) // 2


def test_a_measurement_that_shows_realisations_slow_makes_their_kin_less_urgent(setup):
    """The prior recalibrated by what was measured: where the lab finds realisations slower than the
    model said, the kin of their topology are predicted slower too, and their items move back."""
    family = setup.ruleset.families["row_sum_tree"]
    records = [r for r in setup.full.records if r["family"] == "row_sum_tree" and r["dtype"] == "float32"
               and r["params"]["topology"] == "cluster8" and r["params"]["threads"] == 1024]
    full = [r for r in records if r["rows"] > max(lab.FEW_ROWS)]
    # on this GPU a row sum split over a cluster of eight is several times slower than modelled
    assert all(r["seconds"] > 2 * plan.model_terms(family, "float32", r["params"], (r["rows"], r["cols"]), setup.hw)[0]
               for r in full)
    decisions = [d for d in setup.decisions if d.what == "lab grid row_sum_tree float32" and d.shapes[0][0] > max(lab.FEW_ROWS)]
    done = {(r["id"], r["cols"]) for r in records}
    before = priority.urgencies(priority.pending(list(setup.configs), set()), decisions,
                                priority.Estimates(setup.ruleset, setup.hw), set())
    prior = budget.prior_of(records, setup.hw, {"device": "d", "date": "d"})
    after = priority.urgencies(priority.pending(list(setup.configs), done), decisions,
                               priority.Estimates(setup.ruleset, setup.hw, prior), done)
    kin = [key for key in after if key[0].startswith("row_sum_tree.float32.") and key[0].endswith(".cluster8")]
    assert len(kin) == 3 * 2 * len(lab.COLS)   # t128, t256 and t512, 4- and 16-byte packs, at every row length
    assert all(after[k][priority.GRID] > before[k][priority.GRID] for k in kin)


def test_a_budgeted_run_stays_within_its_budget_and_measures_the_most_urgent_first(setup, run):
    assert run.stopped_by_budget and 0 < len(run.records) < len(setup.full.records)
    by_realisation: dict[str, float] = {}
    for rs in replay._by_item(setup.full.records).values():
        by_realisation[rs[0]["id"]] = by_realisation.get(rs[0]["id"], 0.0) + cost.measure_seconds(r["seconds"] for r in rs)
    # the lab stops before a realisation that would start past the budget: one may end past it
    assert BUDGET - max(by_realisation.values()) <= run.seconds <= BUDGET + max(by_realisation.values())
    assert len(run.rounds) >= 2 and all(r["measured"] == r["items"] for r in run.rounds[:-1])
    # the first round is the head of the order on the model alone
    estimates = priority.Estimates(setup.ruleset, setup.hw)
    head = [item.key for item, _ in priority.order(priority.pending(list(setup.configs), set()),
                                                   list(setup.decisions), estimates, set())][:run.rounds[0]["items"]]
    assert set(head) == {(r["id"], r["cols"]) for r in run.records[:run.rounds[0]["records"]]}


def test_a_partial_profile_says_how_much_of_what_it_measured_and_in_which_order(setup, run):
    coverage = budget.partial_provenance(list(setup.configs), run.records, BUDGET, 119.0)
    items = sum(len(lab.row_lengths(c)) for c in setup.configs)
    assert coverage["items"] == items and coverage["items_measured"] == len({(r["id"], r["cols"]) for r in run.records})
    assert coverage["realisations"] == len(setup.configs) and coverage["budget_seconds"] == BUDGET
    assert coverage["order"] == priority.ORDER_RULE
    assert budget.partial_provenance(list(setup.configs), list(setup.full.records), BUDGET, 1.0) is None


def test_a_later_run_resumes_what_a_budgeted_run_left_in_order_and_an_unbudgeted_one_finishes_it(setup):
    first = replay.simulate(setup, 20.0)
    second = replay.simulate(setup, 20.0, kept=first.records)
    measured_first = {(r["id"], r["cols"]) for r in first.records}
    measured_second = {(r["id"], r["cols"]) for r in second.records}
    assert measured_second and not measured_first & measured_second
    # its first round is the head of the order given what the first run measured
    estimates = priority.Estimates(setup.ruleset, setup.hw, budget.prior_of(first.records, setup.hw, setup.full.provenance))
    head = [item.key for item, _ in priority.order(priority.pending(list(setup.configs), measured_first),
                                                   list(setup.decisions), estimates, measured_first)]
    taken = {(r["id"], r["cols"]) for r in second.records[:second.rounds[0]["records"]]}
    assert taken and taken <= set(head[:second.rounds[0]["items"]])   # the deadline may cut a round short
    rest = replay.simulate(setup, math.inf, kept=first.records + second.records)
    everything = measured_first | measured_second | {(r["id"], r["cols"]) for r in rest.records}
    assert len(everything) == sum(len(lab.row_lengths(c)) for c in setup.configs)
    assert not rest.stopped_by_budget
    assert budget.partial_provenance(list(setup.configs), first.records + second.records + rest.records, 1, 1) is None


def test_a_budgeted_profile_written_and_read_back_is_kept_by_the_next_run_on_the_same_cubins(setup, run, tmp_path):
    """What doit primitives writes when its budget ends: the realisation profile, usable by the
    planner, whose records a later run keeps (lab.reusable) where its cubins are unchanged."""
    ids = sorted({r["id"] for r in run.records})
    method = lab.method("NVIDIA H200", setup.full.provenance["driver"])
    provenance = {**{k: setup.full.provenance[k] for k in realisation.PROVENANCE}, "lab": method,
                  "cubins": {i: f"digest of {i}" for i in ids}, "measured_on": {i: "2026-12-06" for i in ids},
                  "partial": budget.partial_provenance(list(setup.configs), run.records, BUDGET, 119.0)}
    path = tmp_path / "nvidia-h200.realisation.json"
    realisation.save(path, provenance, run.records)
    source = probe_tasks._profile_source(path, method)
    assert len(source.records) == len(run.records) and json.loads(path.read_text())["provenance"]["partial"]
    changed = ids[0]
    kept = lab.reusable({**source.cubins, changed: "another digest"}, [source])
    assert {r["id"] for r in kept.records} == set(ids) - {changed}
    prior = realisation.MeasuredPrior(realisation.load(path), setup.hw)
    r = run.records[0]
    assert prior(setup.ruleset.families[r["family"]], r["dtype"], r["params"], (r["rows"], r["cols"])) > 0


def test_an_instance_planned_on_what_the_budget_measured_is_as_fast_as_on_the_full_profile(setup, run):
    """Every shipped profile planned on the partial profile a budget of BUDGET seconds leaves, scored
    by the full profile (docs/lab.md): a geometric-mean slowdown of 1.0000 over the 164 cases of six profiles, the
    worst 1.002, when written; with no profile at all (the model alone) 1.141, the worst 3.45. And
    the planner sends about as many candidates to the device as on the full profile."""
    scored = replay.score(setup, run.records)
    assert len(scored["cases"]) == 236   # seven profiles: the default (now the H100's) and the H200's plan the same workload
    assert scored["geomean_slowdown"] <= 1.01
    assert max(c["slowdown"] for c in scored["cases"]) <= 1.05
    for name, (partial, full) in scored["candidates"].items():
        assert partial <= 1.1 * full + 2, name


def test_the_cost_estimate_gives_the_full_run_its_measured_length(setup):
    """The lab measured every realisation of the recorded profile in about 21 minutes with its compiles."""
    assert 0.95 * 21 * 60 <= replay.full_seconds(setup) <= 1.05 * 21 * 60


@pytest.mark.parametrize("text", ["0", "-5", "soon", "nan", "inf"])
def test_a_budget_that_is_not_a_positive_number_of_seconds_is_a_clear_error(text):
    with pytest.raises(InputError, match=r"doit primitives: budget: expected a number of seconds > 0"):
        probe_tasks.parse_budget(text)
    assert probe_tasks.parse_budget("90") == 90.0 and probe_tasks.parse_budget(None) is None


class _RecordedGPU:
    """The GPU of the recorded profile, as doit primitives sees a device: its name, arch, driver, L2."""
    name, compute_capability, arch = "NVIDIA H200", (9, 0), "sm_90"
    attributes = {"L2_CACHE_SIZE": 60 << 20}

    def __init__(self, driver_version: str):
        self.driver_version = driver_version

    def clocks(self) -> str:
        return "sm 1980 MHz"


@pytest.fixture
def recorded_lab(repo, setup, tmp_path, monkeypatch):
    """doit primitives on a copy of the project whose hwdb has no realisation profile yet, its device
    the recorded one: a compile gives each realisation the same bytes every time, a measurement
    gives the recorded profile's records, and the clock advances by what each would have cost."""
    import shutil
    root = tmp_path / "project"
    for folder in ("rulesets", "kernels"):
        shutil.copytree(repo / folder, root / folder)
    (root / "hwdb").mkdir()
    for entry in (repo / "hwdb").glob("*.toml"):
        shutil.copy(entry, root / "hwdb" / entry.name)
    recorded = replay._by_item(setup.full.records)
    clock, compiled = [0.0], []

    def records_of(c: lab.Config, cols: int) -> list[dict]:
        """Its records; for a family the recorded profile predates, its declared twin's, as its own."""
        if (c.id, cols) in recorded:
            return recorded[c.id, cols]
        twin = plan.candidate_id(setup.ruleset.families[c.family].timed_like, c.dtype, c.params)
        return [{**r, "id": c.id, "family": c.family} for r in recorded[twin, cols]]

    def compile_all(configs, *args, **kwargs):
        compiled.extend(c.id for c in configs)
        clock[0] += cost.compile_seconds(len(configs), replay.COMPILE_WORKERS)
        return {c.id: c.id.encode() for c in configs}

    def measure(configs, cubins, l2_bytes, progress=print, keep=None, lengths=None, stop=None):
        clock[0] += replay.ORDERING_SECONDS   # the round's ordering, as the replay counts it
        out = []
        for c in configs:
            if stop is not None and stop():
                break
            for cols in (lengths or {}).get(c.id, lab.row_lengths(c)):
                clock[0] += cost.measure_seconds(r["seconds"] for r in records_of(c, cols))
                out += [dict(r) for r in records_of(c, cols)]
        if keep is not None:
            keep(out)
        return out
    monkeypatch.setattr(lab, "compile_all", compile_all)
    monkeypatch.setattr(lab, "measure", measure)
    monkeypatch.setattr(probe_tasks, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])}))
    monkeypatch.setattr(probe_tasks, "_session", {"gpu": _RecordedGPU(setup.full.provenance["driver"])})

    def primitives(budget_text):
        clock[0] = 0.0
        compiled.clear()
        result = probe_tasks.run_primitives(root / "hwdb", root / "rulesets", root / "kernels", budget_text)
        assert result == {"profile": str(root / "hwdb/nvidia-h200.realisation.json")}, result
        assert not (root / "hwdb/nvidia-h200.realisation.partial.json").exists()
        return realisation.load(root / "hwdb/nvidia-h200.realisation.json"), list(compiled), clock[0]
    return primitives


def test_doit_primitives_with_a_budget_writes_a_partial_profile_and_the_next_runs_resume_it(setup, recorded_lab):
    configs = lab.configurations(setup.ruleset, setup.hw)   # those of a family the recorded profile predates too
    items = sum(len(lab.row_lengths(c)) for c in configs)
    first, compiled, spent = recorded_lab("30")
    partial = first.provenance["partial"]
    measured = {(r["id"], r["cols"]) for r in first.records}
    assert partial["items_measured"] == len(measured) < items and partial["budget_seconds"] == 30
    assert partial["order"] == priority.ORDER_RULE and partial["rounds"]
    assert first.provenance["method"].startswith(f"partial: {len(measured)} of {items} ")
    assert spent <= 30 + 5 and set(first.provenance["cubins"]) == {r["id"] for r in first.records}
    # only what a round took was compiled, each once
    assert len(compiled) == len(set(compiled)) < len(configs) // 2
    assert {r["id"] for r in first.records} <= set(compiled)
    # the next budgeted run keeps those (same method, GPU, driver and cubins) and measures what is left, in order
    second, compiled, _ = recorded_lab("30")
    again = {(r["id"], r["cols"]) for r in second.records}
    assert measured < again and second.provenance["partial"]["items_measured"] == len(again)
    assert sum((r["id"], r["cols"]) in measured for r in second.records) == len(first.records)
    # without a budget, every realisation: the profile is whole again
    whole, _, _ = recorded_lab(None)
    assert "partial" not in whole.provenance and not whole.provenance["method"].startswith("partial")
    assert {(r["id"], r["cols"]) for r in whole.records} == {(c.id, n) for c in configs for n in lab.row_lengths(c)}


def test_doit_primitives_with_a_budget_that_is_not_a_number_fails_and_writes_nothing(recorded_lab, tmp_path):
    with pytest.raises(AssertionError, match="budget: expected a number of seconds > 0"):
        recorded_lab("ten minutes")
    assert not (tmp_path / "project/hwdb/nvidia-h200.realisation.json").exists()


def test_a_replay_refuses_a_partial_profile_and_says_what_would_make_it_whole():
    """The H100's shipped profile is a budgeted run's: replaying it would score a partial plan against
    another partial one."""
    with pytest.raises(SystemExit, match="a partial profile .* needs one that measured every realisation"):
        replay.main(["--target", "h100-sxm", "60"])
