"""Probing without a GPU: curve analysis, the hwdb merge, plan inputs, and re-probes in a build."""
from __future__ import annotations

import math

import pytest

from aicg import hw, plan_inputs
from aicg.errors import InputError
from aicg.probe import curves, record, registry
from aicg.probe.figures import Curve, Figure, ProbeResult, figure
from doit_project import doit, make_project

PROFILE = "profile=rulesets/profiles/small.toml"
MiB = 1 << 20


# --- curves ---------------------------------------------------------------

def _steps(xs, edges, values, ramp=0):
    """A step curve: values[i] until x passes edges[i]; `ramp` points of geometric slope per step."""
    ys = []
    for x in xs:
        level = sum(x > e for e in edges)
        ys.append(values[level])
    if ramp:
        for e in edges:
            i = next(k for k, x in enumerate(xs) if x > e)
            lo, hi = ys[i - 1], ys[min(len(ys) - 1, i + ramp)]
            for r in range(ramp):
                ys[i + r] = lo * (hi / lo) ** ((r + 1) / (ramp + 1))
    return ys


def test_knees_of_a_latency_ladder_are_found_between_their_levels():
    xs = [2 ** (k / 4) * 1024 for k in range(0, 4 * 20)]       # 1 KiB .. 1 GiB, 4 per octave
    ys = _steps(xs, [200 * 1024, 50 * MiB], [33, 260, 620])
    found = curves.knees(xs, ys)
    assert len(found) == 2
    l1, l2 = found
    # within one sampling step (a quarter octave) of the true capacity
    assert abs(math.log2(l1.x / (200 * 1024))) <= 0.25 and abs(math.log2(l2.x / (50 * MiB))) <= 0.25
    assert (round(l1.before.value), round(l1.after.value), round(l2.after.value)) == (33, 260, 620)


def test_a_gradual_fall_puts_the_knee_at_the_geometric_midpoint():
    xs = [2 ** (k / 3) * MiB for k in range(0, 3 * 10)]
    ys = _steps(xs, [40 * MiB], [12e12, 4e12], ramp=4)
    (knee,) = curves.knees(xs, ys)
    middle = math.sqrt(12e12 * 4e12)
    i = next(k for k, y in enumerate(ys) if y <= middle)
    assert xs[i - 1] <= knee.x <= xs[i]
    assert knee.ratio == pytest.approx(1 / 3, rel=0.02)


def test_noise_within_a_level_makes_no_knee():
    xs = list(range(1, 40))
    ys = [100 * (1 + 0.05 * math.sin(x)) for x in xs]
    assert curves.knees(xs, ys) == []
    assert len(curves.levels(xs, ys)) == 1


def test_plateau_and_saturation_point_of_a_rising_curve():
    xs = [32, 64, 128, 256, 512, 1024, 2048]
    ys = [0.3, 0.6, 1.2, 2.4, 3.9, 4.1, 4.0]
    assert curves.plateau(xs, ys) == 4.0
    assert curves.saturation_point(xs, ys, 0.9) == 512
    assert curves.saturation_point(xs, ys, 0.5) == 256
    # one lucky point does not move the plateau
    assert curves.plateau(xs, ys[:-1] + [9.0]) == 4.1


@pytest.mark.parametrize("xs, ys", [([1], [1]), ([1, 1], [1, 2]), ([1, 2], [1, 0]), ([1, 2], [1, float("nan")])])
def test_a_malformed_curve_is_refused(xs, ys):
    with pytest.raises(ValueError):
        curves.knees(xs, ys)


def test_a_figure_is_the_median_with_its_relative_range():
    f = figure("x", [9.0, 10.0, 11.0, 10.0, 10.5], "s", "m")
    assert (f.value, f.repetitions, f.spread) == (10.0, 5, 0.2)


# --- the hwdb merge ---------------------------------------------------------

def _result(*figures) -> ProbeResult:
    return ProbeResult(figures=list(figures), curves={"c": Curve("x", "y", ((1, 2), (3, 4)))}, notes=["n"])


def _merge(path, *figs, probe="dram"):
    return record.merge(path, "NVIDIA H200", (9, 0), probe, _result(*figs), "2026-11-30", "580.159.04",
                        "before: sm 1980 MHz; after: sm 1980 MHz")


COPY = Figure("dram_copy_bandwidth", 4.2e12, "byte/s", "copy of 2 GiB", 7, 0.01)


@pytest.fixture
def hwdb_dir(hwdb_dir):
    """The shipped hwdb with the H200's datasheet part only (no measured section, no curves)."""
    path = hwdb_dir / "nvidia-h200.toml"
    text = path.read_text()
    path.write_text(text[:text.index(record.MARKER)].rstrip("\n") + "\n")
    (hwdb_dir / "nvidia-h200.curves.json").unlink(missing_ok=True)
    return hwdb_dir


def test_measured_figures_join_the_entry_and_beat_the_datasheet(hwdb_dir):
    path = record.entry_for(hwdb_dir, "NVIDIA H200", (9, 0))
    assert path.name == "nvidia-h200.toml"
    head = path.read_text()
    report = _merge(path, COPY, Figure("l2_cache", 60 * MiB, "byte", "driver attribute", 1, 0.0))
    assert report.added == ["dram_copy_bandwidth", "l2_cache"]
    text = path.read_text()
    assert text.startswith(head.rstrip("\n"))          # the datasheet part, comments included, as it was
    entry = hw.load(path)
    assert entry.facts["l2_cache"].source == "measured" and entry.facts["l2_cache"].value == 60 * MiB
    assert entry.datasheet["l2_cache"].value == 62914560
    provenance = dict(entry.facts["dram_copy_bandwidth"].provenance)
    assert provenance == {"probe": "dram", "date": "2026-11-30", "driver": "580.159.04",
                          "clocks": "before: sm 1980 MHz; after: sm 1980 MHz", "method": "copy of 2 GiB",
                          "repetitions": 7, "spread": 0.01}


def test_a_reprobe_within_the_spread_keeps_the_file_and_a_larger_move_replaces(hwdb_dir):
    path = hwdb_dir / "nvidia-h200.toml"
    _merge(path, COPY)
    first = path.read_bytes()
    report = _merge(path, Figure(COPY.name, 4.23e12, "byte/s", "copy", 7, 0.004))
    assert report.kept == [COPY.name] and not report.changed
    assert path.read_bytes() == first
    report = _merge(path, Figure(COPY.name, 3.9e12, "byte/s", "copy", 7, 0.004))
    assert report.replaced == [COPY.name]
    assert hw.load(path).facts[COPY.name].value == 3.9e12


def test_figures_of_other_probes_are_kept(hwdb_dir):
    path = hwdb_dir / "nvidia-h200.toml"
    _merge(path, COPY)
    _merge(path, Figure("launch_overhead", 2.1e-6, "s", "batch", 7, 0.02), probe="launch")
    facts = hw.load(path).facts
    assert facts[COPY.name].value == 4.2e12 and facts["launch_overhead"].value == 2.1e-6


def test_an_unknown_device_gets_a_new_entry(hwdb_dir):
    path = record.entry_for(hwdb_dir, "NVIDIA B200", (10, 0))
    assert path.name == "nvidia-b200.toml" and not path.exists()
    _merge(path, COPY)
    assert record.entry_for(hwdb_dir, "NVIDIA B200", (10, 0)) == path
    with pytest.raises(InputError, match="facts"):   # datasheet facts still to be written by a person
        hw.load(path)


def test_outside_a_checkout_the_shipped_entry_is_copied_to_this_directorys_hwdb_then_measured(
        hwdb_dir, tmp_path, monkeypatch):
    own = tmp_path / "elsewhere" / "hwdb"
    shipped = (hwdb_dir / "nvidia-h200.toml").read_bytes()
    entry = hw.load(hwdb_dir / "nvidia-h200.toml")    # the device as its entry names it
    gpu = (entry.name, tuple(entry.compute_capability))
    path = record.writable_entry(hwdb_dir, own, *gpu)
    assert path == own / "nvidia-h200.toml" and path.read_bytes() == shipped
    _merge(path, COPY)
    assert (hwdb_dir / "nvidia-h200.toml").read_bytes() == shipped          # the shipped entry untouched
    assert record.writable_entry(hwdb_dir, own, *gpu) == path
    assert hw.load(path).facts[COPY.name].source == "measured"               # not copied over again
    new = record.writable_entry(hwdb_dir, own, "NVIDIA B200", (10, 0))
    assert new == own / "nvidia-b200.toml" and not new.exists()
    # the tasks read and write where builds do (aicg/cli_layout.py): here, a directory with no rulesets/
    from aicg import cli_layout
    from aicg.tasks import probe_tasks
    monkeypatch.chdir(tmp_path / "elsewhere")
    layout = cli_layout.resolve(tmp_path / "elsewhere")
    probe = next(probe_tasks.task_probe())["actions"][0][1]
    assert probe[1:] == [layout.hwdb, own.resolve()]
    lab = probe_tasks.task_primitives()["actions"][0][1]
    assert lab[2:4] == [cli_layout.shipped("rulesets"), cli_layout.shipped("kernels")] and lab[5] == own.resolve()


def test_a_malformed_entry_is_a_clear_error_and_stays_as_it_was(hwdb_dir, raises_input_error):
    path = hwdb_dir / "nvidia-h200.toml"
    _merge(path, COPY)
    broken = path.read_text().replace('unit = "byte/s"', 'unit = "TB/s"')
    path.write_text(broken)
    with raises_input_error(path, "measured.dram_copy_bandwidth.unit", "'byte/s'"):
        _merge(path, Figure("launch_overhead", 2e-6, "s", "batch", 7, 0.02))
    assert path.read_text() == broken
    path.write_text(broken.replace('unit = "TB/s"', 'unit = "byte/s"') + "\n[facts.late]\nvalue = 1\n")
    with raises_input_error(path, "facts", "nothing after the measured section"):
        _merge(path, COPY)
    path.write_text("schema = 1\n[identity\n")
    with raises_input_error(path, "(syntax)", "valid TOML"):
        _merge(path, COPY)


def test_a_figure_in_the_wrong_unit_for_a_known_fact_is_refused(hwdb_dir, raises_input_error):
    path = hwdb_dir / "nvidia-h200.toml"
    with raises_input_error(path, "measured.l2_cache.unit", "'byte'"):
        _merge(path, Figure("l2_cache", 60.0, "MiB", "attribute", 1, 0.0))


def test_curves_are_kept_per_probe_beside_the_entry(hwdb_dir):
    import json
    path = hwdb_dir / "nvidia-h200.toml"
    record.write_curves(path, "dram", _result(COPY), "2026-11-30", "clocks")
    record.write_curves(path, "launch", _result(), "2026-11-30", "clocks")
    data = json.loads((hwdb_dir / "nvidia-h200.curves.json").read_text())
    assert set(data) == {"dram", "launch"} and data["dram"]["curves"]["c"]["points"] == [[1, 2], [3, 4]]


# --- plan inputs -------------------------------------------------------------

def test_plan_inputs_take_measured_figures_and_say_so(hwdb_dir):
    path = hwdb_dir / "nvidia-h200.toml"
    _merge(path, COPY, Figure("launch_overhead", 2.0e-6, "s", "batch", 7, 0.02))
    entry = hw.load(path)
    measured, datasheet = plan_inputs.resolve(entry), plan_inputs.resolve(entry, measured=False)
    assert measured["dram_bandwidth"].value == 4.2e12
    assert measured["dram_bandwidth"].source == "measured dram_copy_bandwidth (dram probe, 2026-11-30)"
    assert datasheet["dram_bandwidth"] == plan_inputs.PlanInput(4.8e12, "datasheet dram_bandwidth")
    assert measured["launch_seconds"].value == 2.0e-6 and datasheet["launch_seconds"].value == 3e-6
    assert any("measured dram_copy_bandwidth" in line for line in plan_inputs.describe(measured))


# --- probes: registry and kernels ---------------------------------------------

def test_every_probe_declares_its_figures_sources_and_consumer():
    for module in registry.all_probes():
        assert module.NAME in registry.ORDER and callable(module.run)
        assert module.FIGURES and module.SOURCES
        assert "planner" in module.__doc__ or "no " in module.__doc__, module.NAME
        for name, unit in module.FIGURES.items():
            assert hw.REQUIRED_FACTS.get(name, unit) == unit, (module.NAME, name)


@pytest.mark.parametrize("file, arch", sorted({(f, a) for m in registry.all_probes() for f, archs in m.SOURCES
                                               for a in archs}))
def test_every_probe_kernel_compiles(file, arch):
    from aicg.probe.gpu import compile_probe
    assert compile_probe(file, arch)[:4] == b"\x7fELF"


def test_doit_probe_without_a_gpu_fails_with_a_clear_message(tmp_path):
    from aicg.runtime import driver
    if driver.probe_device() is not None:
        pytest.skip("this machine has a GPU")
    project = make_project(tmp_path / "proj")
    run = doit(project, "probe:launch")
    assert run.code != 0 and "no CUDA device" in run.output and "`doit probe` runs on a GPU node" in run.output


# --- re-probes in a build -------------------------------------------------------

def test_only_figures_that_moved_rebuild_the_plans_that_read_them(tmp_path):
    project = make_project(tmp_path / "proj")
    assert doit(project, "build", PROFILE).code == 0
    entry = project / "hwdb/nvidia-h200.toml"

    _merge(entry, COPY)
    run = doit(project, "build", PROFILE)
    assert {"hw:nvidia-h200", "plan:softmax", "plan:row_sum"} <= set(run.executed)
    explained = doit(project, "explain", PROFILE, "op=softmax")
    assert "measured dram_copy_bandwidth (dram probe, 2026-11-30)" in explained.output

    _merge(entry, Figure(COPY.name, 4.21e12, "byte/s", "copy", 7, 0.005))      # within the spread
    assert doit(project, "build", PROFILE).executed == []

    _merge(entry, Figure("wgmma_bf16_flops", 6.6e14, "FLOP/s", "wgmma", 7, 0.01), probe="tensor_cores")
    run = doit(project, "build", PROFILE)
    # no plan reads tensor-core throughput; the manifest records the entry it was built for
    assert run.executed == ["hw:nvidia-h200", "package"]


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_a_probe_that_measured_nothing_writes_nothing(hwdb_dir, value):
    path = record.entry_for(hwdb_dir, "NVIDIA H200", (9, 0))
    before = path.read_bytes()
    with pytest.raises(InputError, match="a positive finite measurement"):
        _merge(path, Figure("dram_copy_bandwidth", value, "byte/s", "copy of 2 GiB", 7, 0.01))
    assert path.read_bytes() == before
