"""GPU test: shapes outside an instance's workload go through the JIT: planned,
compiled, validated on the device before their first launch, cached, correct.

Built for this machine's GPU (`target=auto`); skipped without a GPU that hwdb/ has an entry for. Run on
the device with `pytest -m gpu`.
"""
from __future__ import annotations

import shutil

import pytest

from doit_project import doit, instance_dir, make_project, profile_text

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("device_target")]

PROFILE = profile_text(ops=("softmax", "rmsnorm"), dtypes=("float32", "bfloat16"), shapes=((256, 4096),),
                       per_family=1, extra="[validation]\ntiming_repetitions = 3\n")
NEW_SHAPES = [(1 << 20, 8), (3000, 96), (1, 65536), (5, 7)]


@pytest.fixture(scope="module")
def built(tmp_path_factory, device_target):
    project = make_project(tmp_path_factory.mktemp("gpu_jit"), PROFILE)
    run = doit(project, "build", "profile=rulesets/profiles/small.toml", "target=auto")
    assert run.code == 0, run.output
    return instance_dir(project, device_target.target)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_new_shapes_are_compiled_validated_and_correct(built, tmp_path, dtype):
    torch = pytest.importorskip("torch")
    import aicg
    root = shutil.copytree(built, tmp_path / "instance")
    inst = aicg.load(root)
    t = getattr(torch, dtype)
    tol = {"float32": (1e-5, 1e-7), "bfloat16": (1.6e-2, 1e-5)}[dtype]
    for rows, cols in NEW_SHAPES:
        x = (torch.randn(rows, cols, device="cuda") * 3).to(t)
        w = torch.rand(cols, device="cuda").add(0.5).to(t)
        y = torch.full_like(x, float("nan"))
        inst.softmax(x, out=y)
        ref = torch.softmax(x.double(), -1)
        assert ((y.double() - ref).abs() <= tol[1] + tol[0] * ref.abs()).all(), (rows, cols)
        z = inst.rmsnorm(x, w)
        xd = x.double()
        ref = xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + 1e-5) * w.double()
        assert ((z.double() - ref).abs() <= tol[1] + tol[0] * ref.abs()).all(), (rows, cols)
    # where a first call ran a carried kernel, the predicted best compiled meanwhile: once it has,
    # the shapes' next calls validate and run it
    assert inst.jit.wait(timeout=600)
    for rows, cols in NEW_SHAPES:
        x = (torch.randn(rows, cols, device="cuda") * 3).to(t)
        y = torch.full_like(x, float("nan"))
        inst.softmax(x, out=y)
        ref = torch.softmax(x.double(), -1)
        assert ((y.double() - ref).abs() <= tol[1] + tol[0] * ref.abs()).all(), ("again", rows, cols)
    validated = [e for e in inst.jit_events if "validated" in e]
    assert validated and all(e["validated"] in ("passed", "failed") for e in validated)
    assert all(e.get("reason") for e in validated if e["validated"] == "failed"), validated
    # a kernel that failed its validation is passed over, never run
    failed = {(e["op"], e["candidate"]) for e in validated if e["validated"] == "failed"}
    ran = {(op, candidate) for op in ("softmax", "rmsnorm") for candidate in getattr(inst, op).chosen.values()}
    assert not ran & failed, (ran, validated)
    compiled = [e for e in inst.jit_events if e.get("compiled")]
    assert compiled, "the new shapes need kernels the instance does not carry"
    # a first call times nothing; inst.tune() then times the first usable candidates of every new
    # shape and the fastest runs from then on
    assert not [e for e in inst.jit_events if "timed" in e]
    assert inst.tune()
    timed = [e for e in inst.jit_events if "timed" in e]
    assert timed and all(e["chosen"] == min(e["timed"], key=e["timed"].get) for e in timed), timed
    assert {e["chosen"] for e in timed} <= {c for op in ("softmax", "rmsnorm") for c in getattr(inst, op).chosen.values()}

    empty = torch.empty(0, 777, device="cuda").to(t)     # an untuned shape with nothing in it plans nothing
    before = len(inst.jit_events)
    assert inst.softmax(empty).shape == (0, 777) and len(inst.jit_events) == before

    again = aicg.load(root)          # a new process: cubins and outcomes come from the cache
    x = torch.randn(*NEW_SHAPES[0], device="cuda").to(t)
    again.softmax(x)
    assert again.jit_events == []


def test_a_first_call_runs_a_carried_kernel_and_then_the_compiled_best(built, tmp_path):
    """Where the prior's best for a new shape must be compiled and a kernel the instance carries
    runs the shape, the first call runs the carried one (no compiler waited for) and the best
    compiles on a thread; once it has, the next call validates it on the device and runs it. Both
    results are checked against float64."""
    torch = pytest.importorskip("torch")
    import aicg
    from aicg.runtime import jit as jit_mod
    inst = aicg.load(shutil.copytree(built, tmp_path / "instance"))
    planning = inst.jit.planning()
    found = None
    for rows in (256, 4096, 1 << 16):
        for cols in (1000, 3000, 5120, 12288, 50257):
            ranked = [c.id for c in planning.best_for_shape("softmax", "float32", (jit_mod.rows_class(rows), cols))]
            if ranked and ranked[0] not in inst.jit.packaged and any(c in inst.jit.packaged for c in ranked):
                found = (rows, cols, ranked)
                break
        if found:
            break
    if found is None:
        pytest.skip("no new shape here whose best is compiled while a carried kernel runs it")
    rows, cols, ranked = found
    x = torch.randn(rows, cols, device="cuda") * 3
    ref = torch.softmax(x.double(), -1)
    for call in ("first", "after the compile"):
        y = torch.full_like(x, float("nan"))
        inst.softmax(x, out=y)
        assert ((y.double() - ref).abs() <= 1e-7 + 1e-5 * ref.abs()).all(), call
        ran = inst.softmax.chosen[("float32", rows, cols)]
        if call == "first":
            assert ran in inst.jit.packaged and ran != ranked[0]
            assert any(e.get("compiling") == ranked[0] for e in inst.jit_events)
            assert inst.jit.wait(timeout=600)
        else:
            assert ran == ranked[0]
            assert any(e.get("candidate") == ranked[0] and e.get("validated") == "passed" for e in inst.jit_events)
