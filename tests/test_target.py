"""The target of a build (aicg/target.py): the profile's, target=<hwdb entry>, or target=auto for
the GPU present, read from a device record (faked here: CI has no GPU); the instance named after
it; and the gate of the GPU tests reading the same device."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

from aicg import hw, profile
from aicg import target as targets
from aicg.errors import InputError
from aicg.probe import record
from aicg.runtime import driver
from doit_project import REPO, doit, instance_dir, make_project, profile_text, receipt_keys

HWDB = REPO / "hwdb"
# Fake devices named as their hwdb entries name their GPUs: the tests read names from there.
H100 = driver.DeviceInfo(hw.load_target(HWDB, "h100-sxm").name, (9, 0), 132, 50 << 20)
A100 = driver.DeviceInfo(hw.load_target(HWDB, "a100-sxm4-80gb").name, (8, 0), 108, 40 << 20)
H200 = hw.load_target(HWDB, "nvidia-h200").name
UNKNOWN = driver.DeviceInfo("NVIDIA L40S", (8, 9), 142, 96 << 20)
# the H200's name on another architecture: hwdb/nvidia-h200.toml, the file a probe would take, is not its entry
H200_OTHER_ARCH = driver.DeviceInfo(H200, (10, 0), 132, 60 << 20)
PROFILE = "profile=rulesets/profiles/small.toml"


@pytest.mark.parametrize("device, entry", [(H100, "h100-sxm"), (A100, "a100-sxm4-80gb")])
def test_auto_is_the_entry_whose_identity_is_the_device(device, entry):
    assert targets.resolve("auto", HWDB, device) == entry
    assert hw.load_target(HWDB, entry).name == device.name


def test_a_named_entry_is_itself_whatever_the_device():
    assert targets.resolve("l4", HWDB, H100) == "l4"
    assert targets.resolve("nvidia-h200", HWDB, None) == "nvidia-h200"


def test_auto_without_a_gpu_says_what_it_looked_for():
    with pytest.raises(InputError) as info:
        targets.resolve("auto", HWDB, None)
    message = str(info.value)
    assert message.startswith("command line: target: expected auto only on a machine with a CUDA GPU")
    assert "the CUDA driver, asked for device 0, reports none here" in message
    assert all(entry in message for entry in ("a100-sxm4-80gb", "h100-sxm", "l4", "nvidia-h200"))


def test_auto_for_a_gpu_the_hwdb_does_not_know_says_which_and_how_to_add_it():
    with pytest.raises(InputError) as info:
        targets.resolve("auto", HWDB, UNKNOWN)
    message = str(info.value)
    assert "NVIDIA L40S (sm_89)" in message and "`doit probe`" in message
    assert f"{HWDB}/nvidia-l40s.toml" in message and "facts its CUDA driver reports" in message


def test_a_gpu_named_like_an_entry_on_another_architecture_is_not_that_entry():
    assert targets.entry_of(HWDB, H200_OTHER_ARCH) is None
    with pytest.raises(InputError, match=r"nvidia-h200.toml is another GPU's.*compute_capability = \[10, 0\]"):
        targets.resolve("auto", HWDB, H200_OTHER_ARCH)


@pytest.mark.parametrize("typed, suggestion", [("h100", "h100-sxm"), ("nvidia-h20", "nvidia-h200"),
                                               ("a100", "a100-sxm4-80gb"), ("mi300x", None)])
def test_an_unknown_target_lists_the_entries_and_suggests_the_nearest(typed, suggestion):
    with pytest.raises(InputError) as info:
        targets.resolve(typed, HWDB, H100)
    message = str(info.value)
    assert message.startswith("command line: target: expected auto or an entry of ")
    assert "(one of: a100-sxm4-80gb, h100-sxm, l4, nvidia-h200)" in message and f"found {typed!r}" in message
    assert message.endswith(f"Did you mean {suggestion}?") if suggestion else "Did you mean" not in message


def test_an_instance_for_another_target_is_named_after_it_and_the_profile_file():
    assert targets.instance_name("h200-tolerance", "nvidia-h200", "default", "nvidia-h200") == "h200-tolerance"
    assert targets.instance_name("h200-tolerance", "nvidia-h200", "default", "h100-sxm") == "h100-sxm-default"
    # two profiles at one preservation level stay apart on one GPU
    profiles = REPO / "rulesets/profiles"
    names = {targets.instance_of(profiles / f"{p}.toml", "h100-sxm") for p in ("default", "fused", "synthesis")}
    assert names == {"h100-tolerance", "h100-sxm-fused", "h100-sxm-synthesis"}   # the default is the H100's own
    assert targets.instance_of(profiles / "h200.toml", None) == "h200-tolerance"


def test_a_retargeted_profile_keeps_its_other_settings_and_its_snapshot_plans_for_the_target(
        tmp_path, shipped_ruleset):
    path = REPO / "rulesets/profiles/deterministic.toml"
    own = profile.load(path, shipped_ruleset, HWDB)
    moved = targets.retarget(own, "h100-sxm")
    assert (moved.target, moved.name) == ("h100-sxm", "h100-sxm-deterministic")
    assert (moved.preservation, moved.choice, moved.workload) == (own.preservation, own.choice, own.workload)
    assert targets.retarget(own, own.target) is own
    assert targets.snapshot_profile(path, own) == path.read_bytes()
    copy = tmp_path / "profile.toml"
    copy.write_bytes(targets.snapshot_profile(path, moved))
    again = profile.load(copy, shipped_ruleset, HWDB)
    assert (again.target, again.name, again.preservation, again.choice, again.workload) == (
        "h100-sxm", "h100-sxm-deterministic", own.preservation, own.choice, own.workload)


def datasheet_only(hwdb_dir, entry: str) -> None:
    """The entry as it is before any `doit probe` or `doit primitives` on its GPU."""
    path = hwdb_dir / f"{entry}.toml"
    text = path.read_text()
    if record.MARKER in text:
        path.write_text(text[:text.index(record.MARKER)])
    for beside in (f"{entry}.curves.json", f"{entry}.realisation.json", f"{entry}.matrix.json"):
        (hwdb_dir / beside).unlink(missing_ok=True)


def test_an_entry_without_measurements_says_what_probe_and_primitives_would_add(hwdb_dir):
    datasheet_only(hwdb_dir, "h100-sxm")
    h100, h200 = hw.load_target(hwdb_dir, "h100-sxm"), hw.load_target(HWDB, "nvidia-h200")
    found = targets.notes(h100, has_realisation=False, prior="measured", hwdb_dir=HWDB)
    assert len(found) == 2
    assert "h100-sxm.toml has no measured section" in found[0] and "`doit probe`" in found[0]
    assert "no realisation profile" in found[1] and "`doit primitives`" in found[1]
    assert targets.notes(h100, has_realisation=False, prior="datasheet", hwdb_dir=HWDB) == found[:1]
    assert targets.notes(h200, has_realisation=True, prior="measured", hwdb_dir=HWDB) == []
    matrix = targets.notes(h200, has_realisation=True, prior="measured", hwdb_dir=HWDB, has_matrix_profile=False)
    assert len(matrix) == 1 and "no matrix profile" in matrix[0] and "`doit primitives family=matrix`" in matrix[0]
    assert targets.notes(h200, True, "measured", HWDB, has_matrix_profile=True) == []


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The small profile (for the H200) built for its own target, then for an H100 that nothing
    has measured yet; ranked by the datasheet model, so that both targets plan the same candidates."""
    project = make_project(tmp_path_factory.mktemp("target"), profile_text(extra='prior = "datasheet"'))
    datasheet_only(project / "hwdb", "h100-sxm")
    own = doit(project, "build", PROFILE)
    assert own.code == 0, own.output
    other = doit(project, "build", PROFILE, "target=h100-sxm")
    assert other.code == 0, other.output
    return project, own, other


def test_a_build_for_another_target_lands_beside_the_profiles_own(project):
    project, own, other = project
    assert instance_dir(project, "h100-sxm") == project / "build/h100-sxm-small"
    manifest = json.loads((project / "build/h100-sxm-small/manifest.json").read_text())
    assert manifest["instance"] == "h100-sxm-small" and manifest["target"]["name"] == H100.name
    assert json.loads((project / "build/small/manifest.json").read_text())["target"]["name"] == H200
    assert set(manifest["kernels"]) == {"softmax.float32", "row_sum.float32"}    # the profile's workload
    assert "instance h100-sxm-small -> " in other.output and f"on {H100.name}" in other.output
    # the instance's JIT plans for the H100: its source/ says so
    source = project / "build/h100-sxm-small/source"
    assert tomllib.loads((source / "profile.toml").read_text())["instance"]["target"] == "h100-sxm"
    assert sorted(p.name for p in (source / "hwdb").iterdir()) == ["h100-sxm.toml"]


def test_a_build_for_another_target_reruns_exactly_what_reads_the_hardware(project):
    project, _, _ = project
    origins = json.loads((project / "build/h100-sxm-small/provenance.json").read_text())["origins"]
    own, other = ({name.removesuffix(".msgpack").replace(".", ":", 1): key
                   for name, key in receipt_keys(project, instance).items()} for instance in ("small", "h100-sxm-small"))
    # legality reads no hardware; a candidate both targets plan is compiled once (the same arch and
    # register file: the key holds what the compiler reads, no GPU name) ...
    same = [n for n in other if n.startswith(("legality:", "codegen:", "compile:"))]
    assert len(same) == 2 + 2 * 6 and all(other[n] == own.get(n) and origins[n] == "local" for n in same)
    # ... and validated again, planned and packaged anew: those keys hold the hardware
    moved = [n for n in other if n.startswith(("plan:", "validate:", "package"))]
    assert len(moved) == 2 + 6 + 1 and all(other[n] != own.get(n) for n in moved)
    assert {origins[n] for n in moved if not n.startswith("validate:")} == {"ran"}


def test_what_the_targets_entry_lacks_is_said_once_at_load(project):
    project, own, other = project
    assert other.output.count("aicg: hwdb/h100-sxm.toml has no measured section") == 1
    assert f"`doit probe` on the GPU ({H100.name})" in other.output
    assert "no realisation profile" not in other.output           # the profile asks for none
    assert "aicg: hwdb/" not in own.output
    (project / "rulesets/profiles/measured.toml").write_text(profile_text())
    listed = doit(project, "list", "profile=rulesets/profiles/measured.toml", "target=h100-sxm")
    assert listed.code == 0, listed.output
    assert listed.output.count("has no measured section") == 1 and listed.output.count("no realisation profile") == 1
    assert f"`doit primitives` on the GPU ({H100.name})" in listed.output


def test_target_auto_reads_the_device_and_rebuilds_nothing_already_built(project, monkeypatch):
    project, _, _ = project
    monkeypatch.setattr(targets, "present_device", lambda: H100)
    run = doit(project, "build", PROFILE, "target=auto")
    assert run.code == 0 and run.executed == [], run.output
    assert "nothing to do" in run.output and "instance h100-sxm-small -> " in run.output


def test_the_profiles_own_target_named_or_not_is_the_same_instance(project):
    project, _, _ = project
    for args in ((), ("target=nvidia-h200",), ("target=",)):
        run = doit(project, "build", PROFILE, *args)
        assert run.code == 0 and run.executed == [], (args, run.output)
    assert sorted(p.name for p in (project / "build").iterdir() if not p.name.startswith(".")) == ["h100-sxm-small", "small"]


@pytest.mark.parametrize("value, device, message", [
    ("h100", None, "found 'h100'. Did you mean h100-sxm?"),
    ("auto", None, "expected auto only on a machine with a CUDA GPU"),
    ("auto", UNKNOWN, "NVIDIA L40S (sm_89), has no entry in"),
])
def test_a_target_that_names_no_entry_stops_the_build_and_writes_nothing(tmp_path, monkeypatch, value, device,
                                                                         message):
    monkeypatch.setattr(targets, "present_device", lambda: device)
    project = make_project(tmp_path / "p")
    run = doit(project, "build", PROFILE, f"target={value}")
    assert run.code != 0 and message in run.output, run.output
    assert not (project / "build").exists() or not any((project / "build").iterdir())


# The gate of the GPU tests (tests/conftest.py: device_target), run on real GPU test files in a
# pytest of their own, its device probe replaced by a plugin: the skip reason, or no skip.
FAKE_GPU = '''
import os
from aicg.runtime import driver
_device = os.environ["AICG_FAKE_GPU"]
def _probe(ordinal=0):
    if not _device:
        return None
    name, capability = _device.rsplit("@", 1)
    return driver.DeviceInfo(name, tuple(int(n) for n in capability.split(".")), 132, 50 << 20)
driver.probe_device = _probe
'''


def _gpu_tests(tmp_path, device: str, *files: str) -> str:
    (tmp_path / "fake_gpu.py").write_text(FAKE_GPU)
    env = {**os.environ, "AICG_FAKE_GPU": device,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    # --setup-only: the fixtures run (the gate among them), the tests, which need a real GPU, do not
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "fake_gpu", "-rs", "-q", "--setup-only",
                           "--setup-show", *files], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def test_the_gpu_tests_read_their_target_from_the_device(tmp_path):
    files = ("tests/test_gpu_same_bits.py", "tests/test_gpu_staging.py")
    none = _gpu_tests(tmp_path, "", *files)
    assert "SKIPPED [1] tests/test_gpu_same_bits.py" in none and "no CUDA GPU on this machine" in none, none
    unknown = _gpu_tests(tmp_path, "NVIDIA L40S@8.9", *files)
    assert "7 skipped" in unknown and "NVIDIA L40S (sm_89), has no entry in" in unknown, unknown
    assert "`doit probe` on it creates" in unknown
    h100 = _gpu_tests(tmp_path, f"{H100.name}@9.0", *files)
    assert "SKIPPED" not in h100 and "skipped" not in h100 and "SETUP    S device_target" in h100, h100


def test_the_gate_gives_the_devices_hardware_record_or_why_there_is_none():
    hardware, reason = targets.gpu_target(HWDB, H100)
    assert (hardware.target, hardware.arch, reason) == ("h100-sxm", "sm_90", "")
    assert targets.gpu_target(HWDB, None) == (None, "no CUDA GPU on this machine")
    hardware, reason = targets.gpu_target(HWDB, UNKNOWN)
    assert hardware is None and "NVIDIA L40S" in reason and "`doit probe`" in reason


def test_the_gate_skips_a_gpu_whose_new_entry_has_no_datasheet_facts(hwdb_dir):
    (hwdb_dir / "nvidia-l40s.toml").write_text('schema = 1\n\n[identity]\nname = "NVIDIA L40S"\narch = "sm_89"\n'
                                               'compute_capability = [8, 9]\n')
    assert targets.resolve("auto", hwdb_dir, UNKNOWN) == "nvidia-l40s"
    hardware, reason = targets.gpu_target(hwdb_dir, UNKNOWN)
    assert hardware is None and "cannot be built for" in reason and "facts" in reason
