"""GPU tests of the matrix family in the build graph: `doit build target=auto` of a profile with
[[matmul]] classes validates and times every planned candidate on this machine's GPU, packages
only validated kernels, and inst.matmul / inst.linear match float64 within the profile's
tolerance at the workload shapes, at shapes outside it (the packaged kernel estimated fastest,
then what inst.tune() chose there) and with the epilogue fused.

Skipped without a GPU that hwdb/ has an entry for; run on a GPU node with
`pytest -m gpu tests/test_gpu_matrix_build.py`.
"""
from __future__ import annotations

import json

import pytest

from doit_project import doit, instance_dir, make_project

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("device_target")]

PROFILE = """
[instance]
name = "gpu-matmul"
target = "h100-sxm"
preservation = "tolerance"

[plan]
candidates_per_family = 2

[[matmul]]
dtypes = ["bfloat16"]
shapes = [[8, 2048, 2048], [1000, 1024, 1024]]

[[matmul]]
dtypes = ["bfloat16"]
b_major = "mn"
epilogue = { bias = true, activation = "gelu_tanh" }
shapes = [[512, 768, 1024]]

[[matmul]]
dtypes = ["float16"]
epilogue = { bias = true, activation = "gelu_erf", residual = true }
shapes = [[256, 1024, 512]]
"""
RTOL = {"bfloat16": 1.6e-2, "float16": 1e-3}      # the tolerance preset's


@pytest.fixture(scope="module")
def built(tmp_path_factory, device_target):
    project = make_project(tmp_path_factory.mktemp("gpu-matmul"))
    (project / "rulesets/profiles/gpu_matmul.toml").write_text(PROFILE)
    run = doit(project, "build", "profile=rulesets/profiles/gpu_matmul.toml", "target=auto")
    assert run.code == 0, run.output
    return instance_dir(project, device_target.target, "gpu_matmul.toml"), run


def test_every_candidate_is_validated_and_timed_and_every_shape_has_a_valid_kernel(built):
    root, _ = built
    results = {p.name: json.loads(p.read_text()) for p in (root / "validation").glob("*.json")}
    failed = {n: r.get("reason") for n, r in results.items() if r["status"] != "passed"}
    assert results and not failed, failed
    assert all(r["timings"] and all(t["median_seconds"] > 0 for t in r["timings"]) for r in results.values())
    manifest = json.loads((root / "manifest.json").read_text())
    classes = manifest["matrix"]["classes"]
    assert len(classes) == 3
    for entry in classes.values():
        assert entry["status"] == "passed"
        assert all(d["status"] == "passed" and d["measured_seconds"] > 0 for d in entry["dispatch"])
        assert all(k["validation"] == "passed" for k in entry["kernels"].values())


def _reference(torch, a, b, bias=None, residual=None, activation="none"):
    """(float64 result, the scale its error is bounded against: sum_k |a b| + |bias| + |residual|)."""
    a64, b64 = a.double(), b.double()
    pre = a64 @ b64 + (bias.double() if bias is not None else 0)
    scale = a64.abs() @ b64.abs() + (bias.double().abs() if bias is not None else 0)
    act = {"none": lambda x: x, "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
           "gelu_erf": torch.nn.functional.gelu, "silu": torch.nn.functional.silu}[activation]
    post = act(pre) + (residual.double() if residual is not None else 0)
    scale = 1.13 * scale + (residual.double().abs() if residual is not None else 0)
    return post, scale


def _assert_close(torch, y, reference, scale, dtype):
    error = (y.double() - reference).abs()
    bound = RTOL[dtype] * scale + 1e-5
    assert y.dtype == getattr(torch, dtype) and bool((error <= bound).all()), float((error / bound).max())


@pytest.mark.parametrize("m, n, k", [(8, 2048, 2048), (1000, 1024, 1024), (3, 2048, 2048), (37, 1024, 1024),
                                     (1, 1000, 1000)])
def test_linear_matches_float64_at_workload_shapes_and_others(built, m, n, k):
    torch = pytest.importorskip("torch")
    import aicg
    root, _ = built
    inst = aicg.load(root)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(torch.bfloat16)
    with torch.no_grad():
        y = inst.linear(x, w)
        torch.cuda.synchronize()
    _assert_close(torch, y, *_reference(torch, x, w.t()), "bfloat16")
    y2 = inst.matmul(x, w.t())          # the same class: B is N x K with K contiguous
    torch.cuda.synchronize()
    assert torch.equal(y, y2)


def test_matmul_with_a_row_major_b_and_a_fused_bias_gelu(built):
    torch = pytest.importorskip("torch")
    import aicg
    inst = aicg.load(built[0])
    a = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    b = (torch.randn(1024, 768, device="cuda") / 32).to(torch.bfloat16)
    bias = torch.randn(768, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y = inst.matmul(a, b, bias=bias, activation="gelu_tanh")
        torch.cuda.synchronize()
    _assert_close(torch, y, *_reference(torch, a, b, bias, activation="gelu_tanh"), "bfloat16")
    with pytest.raises(ValueError, match="no matrix kernels for bfloat16"):
        inst.matmul(a, b)               # plain with a row-major B: not a class of this instance


def test_float16_bias_gelu_residual_fused(built):
    torch = pytest.importorskip("torch")
    import aicg
    inst = aicg.load(built[0])
    a = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    w = (torch.randn(1024, 512, device="cuda") / 512 ** 0.5).to(torch.float16)
    bias = torch.randn(1024, device="cuda", dtype=torch.float16)
    residual = torch.randn(256, 1024, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        y = inst.matmul(a, w.t(), bias=bias, residual=residual, activation="gelu_erf")
        torch.cuda.synchronize()
    _assert_close(torch, y, *_reference(torch, a, w.t(), bias, residual, "gelu_erf"), "float16")


def test_tune_chooses_a_validated_kernel_for_a_shape_outside_the_workload_and_it_stays_right(built, tmp_path):
    torch = pytest.importorskip("torch")
    import shutil

    import aicg
    root = shutil.copytree(built[0], tmp_path / built[0].name)      # a JIT cache of its own
    inst = aicg.load(root)
    x = torch.randn(300, 1024, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(1536, 1024, device="cuda") / 32).to(torch.bfloat16)
    reference = _reference(torch, x, w.t())
    with torch.no_grad():
        first = inst.linear(x, w)
        torch.cuda.synchronize()
        _assert_close(torch, first, *reference, "bfloat16")
        assert inst.tune() == [("matmul", "matmul.bfloat16.kk.plain", 300, 1536, 1024)]
        (event,) = [e for e in inst.jit_events if "tried" in e]
        assert event["tried"][event["chosen"]]["status"] == "passed", event
        tuned = inst.linear(x, w)
        torch.cuda.synchronize()
        _assert_close(torch, tuned, *reference, "bfloat16")
        later = aicg.load(root)                     # a later process: nothing compiled, validated or timed
        assert torch.equal(later.linear(x, w), tuned) and later.tune() == [] and later.jit_events == []
