"""What a build takes on trust (aicg/trust.py): each case is an attack or an accident that once got through."""
from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path

import pytest

import aicg
from aicg import cas, digest, trust
from aicg.config import StoreConfig
from aicg.runtime.instance import InstanceError
from aicg.runtime.jit import Jit
from aicg.store import LayeredStore, action_name
from aicg.tasks import graph, package, step
from doit_project import doit, instance_files, make_project

PROFILE = "profile=rulesets/profiles/small.toml"


def _env(tmp_path, remote=None, key=None) -> step.Env:
    config = StoreConfig(tmp_path / "cache", str(remote) if remote else None, False, 1.0, key, False)
    return step.Env(tmp_path / "inst", LayeredStore(config, warn=lambda message: None))


def _plant_remote_entry(remote: Path, key: str, kind: str, outputs: dict[str, bytes], signing_key=None) -> None:
    """What a hostile (or careless) writer of a shared directory remote can put there."""
    shas = {relpath: hashlib.sha256(data).hexdigest() for relpath, data in outputs.items()}
    for relpath, data in outputs.items():
        cas.write_atomic(remote / "cas" / shas[relpath], data)
    entry = cas.ActionEntry(key, kind, {p: digest.of_bytes(d) for p, d in outputs.items()}, shas)
    signature = None
    if signing_key is not None:
        import hmac
        signature = hmac.new(signing_key, cas.entry_payload(entry), hashlib.sha256).digest()
    cas.write_atomic(remote / "ac" / action_name(key), cas.encode_entry(entry, signature))


# --- an entry writes only what its step declares ---------------------------------

@pytest.mark.parametrize("path", ["../escaped", "../../escaped", "/tmp/aicg-escaped-absolute", "hw/../../escaped",
                                  ".receipts/hw.x.msgpack", "hw\\..\\escaped", "undeclared.json", ""])
def test_a_store_entry_naming_an_undeclared_or_escaping_path_is_a_miss(tmp_path, path):
    remote = tmp_path / "remote"
    env = _env(tmp_path, remote)
    hw = step.Step("hw:x", "", {"v": 1}, lambda ctx: step.Result({"hw/x.json": b"honest"}), ("hw.py",),
                   targets=("hw/x.json",))
    _plant_remote_entry(remote, step.key(hw, env), "hw", {"hw/x.json": b"planted", path: b"pwned"})
    assert step.execute(hw, env) == "ran"
    assert (env.instance_dir / "hw/x.json").read_bytes() == b"honest"
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/aicg-escaped-absolute").exists()
    assert env.store.stats["refused_entries"] == 1


def test_a_step_whose_own_result_names_an_undeclared_path_fails(tmp_path):
    env = _env(tmp_path)
    sloppy = step.Step("hw:x", "", {}, lambda ctx: step.Result({"hw/x.json": b"", "extra.json": b""}), ("hw.py",),
                       targets=("hw/x.json",))
    with pytest.raises(RuntimeError, match="does not declare: extra.json"):
        step.execute(sloppy, env)
    assert env.receipt("hw:x") is None


def test_clean_removes_only_what_the_step_declares(tmp_path):
    env = _env(tmp_path)
    hw = step.Step("hw:x", "", {}, lambda ctx: step.Result({"hw/x.json": b"{}"}), ("hw.py",), targets=("hw/x.json",))
    step.execute(hw, env)
    victim = tmp_path / "victim.txt"
    victim.write_text("a user's file")
    receipt = env.receipt("hw:x")     # a receipt someone edited to name a file outside the instance
    env.write_receipt("hw:x", {**receipt, "outputs": {**receipt["outputs"], "../victim.txt": "0" * 32}})
    step.clean(hw, env)
    assert victim.read_text() == "a user's file" and not (env.instance_dir / "hw/x.json").exists()


def test_a_hostile_directory_remote_writes_nothing_outside_a_real_build(tmp_path):
    first = make_project(tmp_path / "first")
    assert doit(first, "build", PROFILE).code == 0
    remote = tmp_path / "remote"
    instance = graph.load_instance(graph.Layout(first), first / "rulesets/profiles/small.toml", first / "build")
    for s in instance.steps:   # every step's key answered with a file planted beside the project
        _plant_remote_entry(remote, step.key(s, instance.env), s.kind,
                            {**{t: b"planted" for t in s.targets}, "../../../planted-by-remote": b"x"})
    second = make_project(tmp_path / "second")
    run = doit(second, "build", PROFILE, env={"AICG_REMOTE": str(remote)})
    assert run.code == 0, run.output
    assert not list(tmp_path.rglob("planted-by-remote"))
    assert instance_files(second) == instance_files(first)
    assert doit(second, "clean", PROFILE).code in (0, None) and (tmp_path / "first/dodo.py").exists()


# --- evidence from an unsigned remote is not a pass ---------------------------------

def _forge_passes(project: Path, remote: Path, signing_key=None) -> list[str]:
    """A remote answering every validation of the project's instance with "passed, 1 us"."""
    instance = graph.load_instance(graph.Layout(project), project / "rulesets/profiles/small.toml", project / "build")
    forged = []
    for s in instance.steps:
        if s.kind == "validate":
            record = {"status": "passed", "device": instance.hardware.name,
                      "checks": [{"shape": [64, 1000], "trial": 0, "passed": True}],
                      "timings": [{"shape": [64, 1000], "median_seconds": 1e-6}]}
            _plant_remote_entry(remote, step.key(s, instance.env), "validate", {s.targets[0]: graph.to_json(record)},
                                signing_key)
            forged.append(s.name)
    return forged


def test_passes_from_an_unsigned_remote_are_unverified_and_refused_by_load(tmp_path):
    project = make_project(tmp_path / "p")
    assert doit(project, "build", PROFILE).code == 0      # the keys of a CPU build
    remote = tmp_path / "remote"
    assert _forge_passes(project, remote)
    shutil.rmtree(project / "build")
    run = doit(project, "build", PROFILE, env={"AICG_REMOTE": str(remote)})
    assert run.code == 0, run.output
    manifest = json.loads((project / "build/small/manifest.json").read_text())
    assert {k["validation"] for k in manifest["kernels"].values()} == {"unverified"}
    assert "UNVERIFIED" in run.output and "unsigned remote" in run.output
    assert "passed" not in {k["validation"] for k in manifest["kernels"].values()}
    inst = aicg.load(project / "build/small", jit=False)
    assert not inst.ops and len(inst.skipped) == len(manifest["kernels"])
    # the local copy of the remote's entries stays untrusted once the remote is gone
    shutil.rmtree(project / "build")
    assert doit(project, "build", PROFILE).code == 0
    manifest = json.loads((project / "build/small/manifest.json").read_text())
    assert {k["validation"] for k in manifest["kernels"].values()} == {"unverified"}


def test_signed_passes_count_with_the_key(tmp_path):
    key = b"team secret"
    (tmp_path / "key").write_bytes(key)
    project = make_project(tmp_path / "p")
    assert doit(project, "build", PROFILE).code == 0
    remote = tmp_path / "remote"
    _forge_passes(project, remote, signing_key=key)   # signed: as a GPU node holding the key would
    shutil.rmtree(project / "build")
    run = doit(project, "build", PROFILE, env={"AICG_REMOTE": str(remote), "AICG_SIGNING_KEY_FILE": str(tmp_path / "key")})
    assert run.code == 0, run.output
    manifest = json.loads((project / "build/small/manifest.json").read_text())
    assert {k["validation"] for k in manifest["kernels"].values()} == {"passed"}
    gpu = manifest["target"]["name"]   # the profile's target, as its hwdb entry names the GPU
    assert {k["validated_on"] for k in manifest["kernels"].values()} == {gpu}
    assert f"validated on {gpu}" in run.output


@pytest.mark.parametrize("record, why", [
    ({"status": "passed", "checks": [], "timings": [{"shape": [1, 1], "median_seconds": 1e-6}]}, "no passing checks"),
    ({"status": "passed", "checks": [{"passed": True}], "timings": []}, "no valid timings"),
    ({"status": "passed", "checks": [{"passed": True}], "timings": [{"shape": [1, 1], "median_seconds": float("nan")}]},
     "no valid timings"),
    ({"status": "passed", "checks": [{"passed": True}, {"passed": False}], "timings": [{"shape": [1, 1], "median_seconds": 1e-6}]},
     "no passing checks"),
    ({"status": "splendid"}, None),
])
def test_a_validation_record_that_proves_nothing_is_no_pass(record, why):
    status, reason = package._status(record)
    assert status == "failed" and (why is None or why in reason)


# --- the packaged instance and the JIT's records ---------------------------------------

def test_a_signed_manifest_is_checked_on_load(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_bytes(b"team secret")
    project = make_project(tmp_path / "p")
    run = doit(project, "build", PROFILE, env={"AICG_SIGNING_KEY_FILE": str(key_file)})
    assert run.code == 0, run.output
    root = project / "build/small"
    assert trust.signed_by(root / "manifest.json", (root / "manifest.json").read_bytes(), b"team secret")
    aicg.load(root, jit=False, signing_key=b"team secret")
    manifest = json.loads((root / "manifest.json").read_text())
    for entry in manifest["kernels"].values():
        entry["validation"] = "passed"    # a flipped verdict
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InstanceError, match="not signed with the configured signing key"):
        aicg.load(root, jit=False, signing_key=b"team secret")
    with pytest.raises(InstanceError, match="not signed"):
        aicg.load(root, jit=False, signing_key=b"another key")
    # a build with the key puts the signature right again (the manifest is rewritten, not trusted)
    assert doit(project, "build", PROFILE, env={"AICG_SIGNING_KEY_FILE": str(key_file)}).code == 0
    assert {k["validation"] for k in aicg.load(root, jit=False, signing_key=b"team secret",
                                               allow_unvalidated=True).manifest["kernels"].values()} == {"unvalidated"}


def test_a_build_without_a_key_leaves_no_signature(tmp_path):
    project = make_project(tmp_path / "p")
    key_file = tmp_path / "key"
    key_file.write_bytes(b"k")
    assert doit(project, "build", PROFILE, env={"AICG_SIGNING_KEY_FILE": str(key_file)}).code == 0
    assert (project / "build/small/manifest.json.sig").is_file()
    (project / "build/small/manifest.json").unlink()
    assert doit(project, "build", PROFILE).code == 0
    assert (project / "build/small/manifest.json").is_file()
    assert not (project / "build/small/manifest.json.sig").exists()


def test_jit_records_need_the_keys_signature(tmp_path):
    signed = Jit(tmp_path, {}, signing_key=b"k")
    path = tmp_path / "jit/choice-x.json"
    signed._write_record(path, {"candidate": "a"})
    assert signed._read_record(path) == {"candidate": "a"}
    path.write_text(json.dumps({"candidate": "forged"}))
    assert signed._read_record(path) is None
    assert Jit(tmp_path, {})._read_record(path) == {"candidate": "forged"}    # without a key: the user's own files


# --- a store that cannot be written ---------------------------------------------------

def test_a_read_only_store_is_read_and_never_written(tmp_path, monkeypatch):
    project = make_project(tmp_path / "p")
    assert doit(project, "build", PROFILE).code == 0
    cache = project / "cache"
    before = {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()}
    real = cas.write_atomic

    def read_only(path, data, tmp_dir=None):   # root ignores file modes: a read-only mount, simulated
        if Path(path).is_relative_to(cache) or (tmp_dir and Path(tmp_dir).is_relative_to(cache)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real(path, data, tmp_dir)

    monkeypatch.setattr(cas, "write_atomic", read_only)
    shutil.rmtree(project / "build")
    run = doit(project, "build", PROFILE)             # all hits
    assert run.code == 0 and "Traceback" not in run.output, run.output
    edited = project / "kernels/reduce.cuh"
    edited.write_text(edited.read_text() + "\n// an edit: misses that must run without a writable store\n")
    run = doit(project, "build", PROFILE)
    assert run.code == 0 and "Traceback" not in run.output, run.output
    assert "cannot be written" in run.output
    assert {p: p.read_bytes() for p in cache.rglob("*") if p.is_file()} == before
