"""A GPU hwdb/ has never seen: `doit probe` starts its entry with the facts its CUDA driver reports
(aicg/probe/new_entry.py), so that the entry builds without facts written by hand. No GPU needed:
the driver's answers are given here, as the GPUs of hwdb/'s own entries report them."""
from __future__ import annotations

import pytest

from aicg import hw
from aicg.errors import InputError
from aicg.probe import new_entry, record
from aicg.probe.figures import ProbeResult, exact
from doit_project import REPO, doit, instance_dir, make_project

# (memory clock in kHz, memory bus in bits): what the driver reports for each GPU's memory
MEMORY = {"h100-sxm": (2_619_000, 5120), "a100-sxm4-80gb": (1_593_000, 5120), "l4": (6_251_000, 192)}
RATES = ("dram_bandwidth", "fp32_flops", "bf16_tensor_flops")


def driver_answers(entry: str) -> tuple[hw.Hardware, dict[str, int], int]:
    """An entry's datasheet GPU, and the attributes and memory size its driver reports."""
    sheet = hw.load(REPO / "hwdb" / f"{entry}.toml")
    fact = {name: f.value for name, f in sheet.datasheet.items()}
    attributes = {attribute: int(fact[name]) for name, attribute in new_entry.FROM_ATTRIBUTE.items()}
    memory_khz, bus_bits = MEMORY[entry]
    attributes.update(CLOCK_RATE=int(fact["boost_clock"] * 1000), MEMORY_CLOCK_RATE=memory_khz,
                      GLOBAL_MEMORY_BUS_WIDTH=bus_bits)
    return sheet, attributes, int(fact["dram_capacity"])


@pytest.mark.parametrize("entry", sorted(MEMORY))
def test_a_new_entry_from_the_driver_has_every_fact_near_the_datasheet(entry, tmp_path):
    sheet, attributes, memory = driver_answers(entry)
    found, missing = new_entry.facts(attributes, memory, sheet.compute_capability)
    assert missing == []
    path = tmp_path / f"{entry}.toml"
    path.write_text(new_entry.head(sheet.name, sheet.compute_capability, found, missing))
    built = hw.load(path)
    assert (built.name, built.compute_capability) == (sheet.name, sheet.compute_capability)
    for name in hw.REQUIRED_FACTS:
        got, want = built.facts[name], sheet.datasheet[name]
        assert got.source == "driver" and got.unit == want.unit and got.ref
        # the peak rates follow from the driver's clocks and the architecture's per-SM rates: the
        # H100's tensor peak at its maximum clock (1980 MHz) is 8% above the datasheet's (1830 MHz)
        assert got.value == pytest.approx(want.value, rel=0.1 if name in RATES else 1e-9), name


def test_an_architecture_the_table_does_not_know_leaves_its_rates_out_and_says_which(tmp_path):
    sheet, attributes, memory = driver_answers("h100-sxm")
    found, missing = new_entry.facts(attributes, memory, (12, 0))
    assert missing == ["max_registers_per_thread", "fp32_flops", "bf16_tensor_flops"]
    assert "dram_bandwidth" in found and "boost_clock" in found
    text = new_entry.head("Some Future GPU", (12, 0), found, missing)
    assert "max_registers_per_thread, fp32_flops, bf16_tensor_flops" in text
    path = tmp_path / "some-future-gpu.toml"
    path.write_text(text)
    with pytest.raises(InputError, match="facts.max_registers_per_thread"):
        hw.load(path)


def test_a_clock_the_driver_does_not_report_leaves_the_facts_that_need_it_out():
    sheet, attributes, memory = driver_answers("a100-sxm4-80gb")
    found, missing = new_entry.facts({**attributes, "CLOCK_RATE": 0, "MEMORY_CLOCK_RATE": 0}, memory, (8, 0))
    assert missing == ["dram_bandwidth", "boost_clock", "fp32_flops", "bf16_tensor_flops"]
    assert found["max_registers_per_thread"]["value"] == 255


def test_the_probe_starts_a_new_entry_with_the_head_and_never_rewrites_it(tmp_path):
    sheet, attributes, memory = driver_answers("l4")
    found, missing = new_entry.facts(attributes, memory, sheet.compute_capability)
    head = new_entry.head(sheet.name, sheet.compute_capability, found, missing)
    path = tmp_path / "hwdb" / "nvidia-l4.toml"
    path.parent.mkdir()
    result = ProbeResult(figures=[exact("sm_count", 58, "SM", "cuDeviceGetAttribute(...)")])
    record.merge(path, sheet.name, sheet.compute_capability, "attributes", result, "2026-12-06", "580", "-", head)
    written = path.read_text()
    assert written.startswith(head.rstrip("\n")) and record.MARKER in written
    loaded = hw.load(path)
    assert loaded.facts["sm_count"].source == "measured" and loaded.datasheet["sm_count"].source == "driver"
    # a second probe merges into the measured section only; an edited head is kept as it is
    edited = written.replace('source = "driver"\n', 'source = "datasheet"\n', 1)
    assert edited != written
    path.write_text(edited)
    record.merge(path, sheet.name, sheet.compute_capability, "attributes",
                 ProbeResult(figures=[exact("sm_count", 60, "SM", "cuDeviceGetAttribute(...)")]),
                 "2026-12-07", "580", "-", "# a head that must not be used\n")
    again = path.read_text()
    assert again.split(record.MARKER)[0] == edited.split(record.MARKER)[0]
    assert hw.load(path).facts["sm_count"].value == 60


def test_a_fact_of_another_source_is_refused_naming_the_choices(tmp_path):
    sheet, attributes, memory = driver_answers("a100-sxm4-80gb")
    found, missing = new_entry.facts(attributes, memory, sheet.compute_capability)
    path = tmp_path / "gpu.toml"
    path.write_text(new_entry.head(sheet.name, sheet.compute_capability, found, missing)
                    .replace('source = "driver"\n', 'source = "wiki"\n', 1))
    with pytest.raises(InputError, match="'datasheet', 'driver'"):
        hw.load(path)


def test_an_instance_builds_for_a_gpu_known_only_by_its_driver(tmp_path):
    """An L40S (compute capability 8.9, no entry shipped): its driver's answers make an entry, and a
    build for it plans, generates and compiles every kernel of a profile for sm_89, leaving them
    unvalidated (no such GPU here) as any build for another GPU does."""
    project = make_project(tmp_path / "proj")
    attributes = dict(MULTIPROCESSOR_COUNT=142, WARP_SIZE=32, MAX_THREADS_PER_BLOCK=1024,
                      MAX_THREADS_PER_MULTIPROCESSOR=1536, MAX_BLOCKS_PER_MULTIPROCESSOR=24,
                      MAX_REGISTERS_PER_MULTIPROCESSOR=65536, MAX_SHARED_MEMORY_PER_BLOCK=49152,
                      MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=101376, MAX_SHARED_MEMORY_PER_MULTIPROCESSOR=102400,
                      L2_CACHE_SIZE=96 * 2**20, CLOCK_RATE=2_520_000, MEMORY_CLOCK_RATE=9_001_000,
                      GLOBAL_MEMORY_BUS_WIDTH=384)
    found, missing = new_entry.facts(attributes, 48 * 2**30, (8, 9))
    assert missing == []
    (project / "hwdb" / "nvidia-l40s.toml").write_text(new_entry.head("NVIDIA L40S", (8, 9), found, missing))
    run = doit(project, "build", "profile=rulesets/profiles/small.toml", "target=nvidia-l40s")
    assert run.code == 0, run.output[-3000:]
    manifest = (instance_dir(project, "nvidia-l40s") / "manifest.json").read_text()
    assert '"sm_89"' in manifest and "UNVALIDATED" in run.output
