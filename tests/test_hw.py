import re
from pathlib import Path

import pytest

from aicg import hw

TARGETS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "hwdb").glob("*.toml"))

MEASURED = """
[measured.dram_bandwidth]
value = 4.1e12
unit = "byte/s"
probe = "dram"
date = "2025-01-01"
driver = "560.35"
clocks = "sm 1980 MHz, mem 3201 MHz"
method = "device-to-device copy, 1 GiB"
repetitions = 20
spread = 0.01
"""


def _drop_table(path, header):
    """Remove the TOML table `[header]` and its keys from the file."""
    text = path.read_text()
    new = re.sub(rf"^\[{re.escape(header)}\]\n(?:(?!\[).*\n)*", "", text, flags=re.M)
    assert new != text
    path.write_text(new)


@pytest.mark.parametrize("target", TARGETS)
def test_shipped_entries_load_with_every_required_fact(repo, target):
    h = hw.load_target(repo / "hwdb", target)
    assert h.target == target
    assert h.arch == "sm_%d%d" % h.compute_capability
    for name, unit in hw.REQUIRED_FACTS.items():
        assert h.facts[name].unit == unit
        # every required fact has a datasheet source, whether or not a probe measured it since
        assert h.datasheet[name].source == "datasheet" and h.datasheet[name].ref and h.datasheet[name].unit == unit
    # Sanity relations that hold on every CUDA device.
    assert h.fact("warp_size") == 32
    assert h.fact("max_threads_per_block") <= h.fact("max_threads_per_sm")
    assert h.fact("shared_memory_per_block") <= h.fact("shared_memory_per_block_optin") <= h.fact("shared_memory_per_sm")
    assert h.identity()["sm_count"] == h.fact("sm_count")
    assert h.as_record()["target"] == target and set(h.as_record()["facts"]) == set(h.facts)


def test_a_measured_fact_beats_the_datasheet(hwdb_dir):
    path = hwdb_dir / "nvidia-h200.toml"
    path.write_text(path.read_text() + MEASURED)
    fact = hw.load(path).facts["dram_bandwidth"]
    assert (fact.value, fact.source, fact.ref) == (4.1e12, "measured", "device-to-device copy, 1 GiB")
    assert dict(fact.provenance) == {"probe": "dram", "date": "2025-01-01", "driver": "560.35",
                                     "clocks": "sm 1980 MHz, mem 3201 MHz",
                                     "method": "device-to-device copy, 1 GiB", "repetitions": 20, "spread": 0.01}


def test_an_unknown_target(hwdb_dir, raises_input_error):
    with raises_input_error(hwdb_dir / "h300.toml", "target", "a hwdb entry, one of: " + ", ".join(TARGETS)):
        hw.load_target(hwdb_dir, "h300")


def test_a_missing_required_fact(hwdb_dir, raises_input_error):
    path = hwdb_dir / "nvidia-h200.toml"
    _drop_table(path, "facts.dram_bandwidth")
    with raises_input_error(path, "facts.dram_bandwidth", "(the fact is missing)"):
        hw.load(path)


@pytest.mark.parametrize("old, new, key, expected", [
    ('unit = "byte/s"', 'unit = "GB/s"', "facts.dram_bandwidth.unit", "'byte/s'"),
    ('value = 132', 'value = "132"', "facts.sm_count.value", "a number"),
    ('value = 132', 'value = 132\nnote = "x"', "facts.sm_count.note", "a known key"),
    ('arch = "sm_90"', 'arch = "sm_80"', "identity.arch", "matching compute_capability [9, 0]"),
    ('compute_capability = [9, 0]', 'compute_capability = [9]', "identity.arch", "'sm_<major><minor>'"),
    ('schema = 1', 'schema = 2', "schema", "one of 1"),
    ('source = "datasheet"', 'source = "blog"', "facts.sm_count.source", "one of 'datasheet'"),
    ('[identity]', '[identiy]', "identity", "a table (the key is missing)"),
    ('[facts.sm_count]', '[facts.sm_count\n', "(syntax)", "valid TOML"),
])
def test_bad_entries(hwdb_dir, raises_input_error, old, new, key, expected):
    path = hwdb_dir / "h100-sxm.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))   # the first occurrence: the first fact of the file
    with raises_input_error(path, key, expected):
        hw.load(path)


def test_a_measured_fact_in_the_wrong_unit_or_without_provenance(hwdb_dir, raises_input_error):
    path = hwdb_dir / "nvidia-h200.toml"
    original = path.read_text()
    path.write_text(original + MEASURED.replace('"byte/s"', '"TB/s"'))
    with raises_input_error(path, "measured.dram_bandwidth.unit", "'byte/s'"):
        hw.load(path)
    path.write_text(original + MEASURED.replace("spread = 0.01\n", ""))
    with raises_input_error(path, "measured.dram_bandwidth.spread", "(the key is missing)"):
        hw.load(path)
