"""GPU tests of the probes: each runs on the device and gives sane, well-formed figures.

They run on any GPU, one that hwdb/ has no entry for included (probing is how its entry
begins: the `gpu_device` fixture, not `device_target`); skipped without a GPU (CI has none).
Run on a GPU node with `pytest -m gpu`.
The figures themselves are judged in docs/performance.md, not here: a test
asserts what must hold on any GPU, never a speed.
"""
from __future__ import annotations

import math

import pytest

from aicg import hw, plan_inputs
from aicg.errors import InputError
from aicg.probe import new_entry, record, registry
from aicg.runtime import driver
from doit_project import doit, make_project

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_device")]


@pytest.fixture(scope="module")
def gpu(gpu_device):
    from aicg.probe.gpu import ProbeGPU
    device = ProbeGPU(progress=lambda line: None)
    yield device
    device.close()


@pytest.mark.parametrize("name", ["attributes", "launch", "atomics", "banks"])
def test_a_probe_gives_positive_finite_figures_in_their_declared_units(gpu, name):
    module = registry.probe(name)
    result = module.run(gpu)
    assert result.figures
    for fig in result.figures:
        assert module.FIGURES[fig.name] == fig.unit
        assert math.isfinite(fig.value) and fig.value > 0, fig
        assert fig.repetitions >= 1 and 0 <= fig.spread < 1, fig


def test_attributes_agree_with_the_driver(gpu):
    figures = {f.name: f.value for f in registry.probe("attributes").run(gpu).figures}
    info = driver.probe_device()
    assert figures["sm_count"] == info.sm_count and figures["l2_cache"] == info.l2_bytes
    # the clock seen under load is a real clock: within the device's range
    assert 100 < figures["sm_clock_under_load"] <= 1.05 * figures["boost_clock"]


def test_bank_conflicts_cost_more_than_conflict_free_access(gpu):
    figures = {f.name: f.value for f in registry.probe("banks").run(gpu).figures}
    assert figures["shared_bank_conflict_32way_penalty"] > 2


def test_doit_probe_writes_the_measured_section_that_plans_then_read(tmp_path, gpu_device):
    project = make_project(tmp_path / "proj")
    run = doit(project, "probe:launch")
    assert run.code == 0, run.output
    # the entry of this GPU, as the probe found (or created) it
    entry = record.entry_for(project / "hwdb", gpu_device.name, gpu_device.compute_capability)
    assert entry.exists(), run.output
    try:
        hardware = hw.load(entry)
    except InputError as err:   # created by this probe for a compute capability architectures.toml lacks
        pytest.skip(f"the entry of {gpu_device.name} cannot be planned with: {err}")
    inputs = plan_inputs.resolve(hardware)
    assert inputs["launch_seconds"].source.startswith("measured launch_overhead (launch probe, ")
    assert (project / "hwdb" / f"{entry.stem}.curves.json").exists()


def test_a_gpu_new_to_hwdb_gets_an_entry_with_every_fact_from_its_driver(tmp_path, gpu_device):
    """With its entry taken away, `doit probe` starts a new one from the driver's facts
    (aicg/probe/new_entry.py): it loads, every required fact present, within 10% of the shipped
    datasheet's where hwdb/ knew the GPU."""
    project = make_project(tmp_path / "proj")
    shipped = record.entry_for(project / "hwdb", gpu_device.name, gpu_device.compute_capability)
    sheet = hw.load(shipped) if shipped.exists() else None
    if shipped.exists():
        shipped.unlink()
    if new_entry.architecture(tuple(gpu_device.compute_capability)) is None:
        pytest.skip(f"aicg/probe/architectures.toml has no rates for {gpu_device.compute_capability}")
    run = doit(project, "probe:launch")
    assert run.code == 0, run.output
    entry = record.entry_for(project / "hwdb", gpu_device.name, gpu_device.compute_capability)
    hardware = hw.load(entry)
    assert {hardware.datasheet[name].source for name in hw.REQUIRED_FACTS} == {"driver"}
    if sheet is not None:
        for name in hw.REQUIRED_FACTS:
            assert hardware.datasheet[name].value == pytest.approx(sheet.datasheet[name].value, rel=0.1), name
