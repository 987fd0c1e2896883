"""The shipped record validates the default instance on a machine without a GPU.

This fails when a kernel, rule or hwdb change lands without `doit record` on the default
profile's GPU: main's record must not be older than its kernels (a check, not a timing).
"""
from __future__ import annotations

import json
import tomllib
import shutil

import pytest

from doit_project import REPO, doit

DEVICE_MANIFEST = REPO / "tests/data/h100-tolerance-device-manifest.json"


@pytest.fixture(scope="module")
def default_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("default")
    for name in ("rulesets", "hwdb", "kernels"):
        shutil.copytree(REPO / name, root / name)
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    run = doit(root, "build")
    assert run.code == 0, run.output
    name = json.loads((REPO / "tests/data/h100-tolerance-device-manifest.json").read_text())["instance"]
    return run, json.loads((root / "build" / name / "manifest.json").read_text()), root / "build" / name


def stale_candidates(instance_dir) -> list[str]:
    """Candidates whose validation the build did not find (every candidate, not only those picked:
    a stale one is passed over for a validated other, silently); a recorded failure is a verdict,
    not staleness. Fails where the build left no outcome at all."""
    outcomes = sorted((instance_dir / "validation").glob("*.json"))
    assert outcomes, f"no validation outcomes in {instance_dir}"
    return [p.stem for p in outcomes if json.loads(p.read_text())["status"] == "unvalidated"]


def test_every_kernel_of_the_default_instance_is_validated_by_the_record(default_build):
    run, manifest, instance_dir = default_build
    assert "UNVALIDATED" not in run.output, ("the record is older than the kernels: run `doit record` on a "
                                             "GPU of the default profile's target\n" + run.output[-3000:])
    assert {k["validation"] for k in manifest["kernels"].values()} == {"passed"}
    assert f"{len(manifest['kernels'])} of {len(manifest['kernels'])} kernels validated on" in run.output
    assert stale_candidates(instance_dir) == [], "the record is older than these candidates"


def _decisions(manifest: dict) -> dict:
    """What a build decided, with every time to 9 significant digits (the last bits of math.log and
    math.exp may differ between machines; the build writes them so rounded)."""
    def portable(value):
        if isinstance(value, float):
            return float(f"{value:.9g}")
        if isinstance(value, dict):
            return {k: portable(v) for k, v in value.items()}
        if isinstance(value, list):
            return [portable(v) for v in value]
        return value
    return portable({k: v for k, v in manifest.items() if k != "inputs"})


def test_a_build_without_a_gpu_decides_what_the_gpu_build_decided(default_build):
    """The device's manifest (tests/data, from `doit record` on the GPU) against this machine's:
    the same picks, cubins, validations and times. (The keys in `inputs` hold the code's digests,
    so they are compared only where the manifest was made by the same commit's code.)"""
    _, manifest, _ = default_build
    device = json.loads(DEVICE_MANIFEST.read_text())
    assert _decisions(manifest) == _decisions(device)


def test_the_matmul_profile_builds_validated_from_the_record(tmp_path):
    """The H100's matmul profile (rulesets/profiles/matmul.toml) on a machine without a GPU: every
    kernel its plan picks has a validation in the shipped record, so every workload shape is served
    by a kernel validated on the target. Fails when a matrix kernel, the matrix prior or its
    calibration changes without `doit record profile=rulesets/profiles/matmul.toml` on an H100."""
    for name in ("rulesets", "hwdb", "kernels"):
        shutil.copytree(REPO / name, tmp_path / name)
    shutil.copy(REPO / "dodo.py", tmp_path / "dodo.py")
    run = doit(tmp_path, "build", "profile=rulesets/profiles/matmul.toml")
    assert run.code == 0, run.output[-3000:]
    assert "UNVALIDATED" not in run.output, ("the record is older than the matrix kernels or their plan: run "
                                             "`doit record profile=rulesets/profiles/matmul.toml` on an H100\n"
                                             + run.output[-3000:])
    shapes = sum(len(c["shapes"]) for c in tomllib.loads((REPO / "rulesets/profiles/matmul.toml").read_text())["matmul"])
    assert f"{shapes} of {shapes} matrix workload shapes run a kernel validated on the target" in run.output
    assert stale_candidates(tmp_path / "build/h100-matmul") == [], "the record is older than these matrix candidates"
