"""GPU test: the fused chains built, validated on the device and called from PyTorch
match float64 over awkward shapes, in every dtype.

Built for this machine's GPU (`target=auto`); skipped without a GPU that hwdb/ has an entry for. Run on
the device with `pytest -m gpu`.
"""
from __future__ import annotations

import math

import pytest

from doit_project import doit, instance_dir, make_project, profile_text

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("device_target")]

DTYPES = ("float32", "bfloat16", "float16")
TOLERANCE = {"float32": (1e-5, 1e-7), "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}
PROFILE = profile_text(ops=("bias_gelu_residual", "residual_rmsnorm"), dtypes=DTYPES, shapes=((512, 4096),),
                       per_family=2, extra="[validation]\ntiming_repetitions = 3\n")


@pytest.fixture(scope="module")
def instance(tmp_path_factory, device_target):
    import aicg
    project = make_project(tmp_path_factory.mktemp("gpu_fused"), PROFILE)
    run = doit(project, "build", "profile=rulesets/profiles/small.toml", "target=auto")
    assert run.code == 0, run.output
    return aicg.load(instance_dir(project, device_target.target))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, x_cols, r_cols", [
    ((512, 4096), None, None), ((3, 1), None, None), ((37, 1000), None, None), ((1, 65536), None, None),
    ((3001, 33), None, None),
    ((37, 1000), 1024, None), ((129, 4096), 4104, 4099)])      # x, or x and r, slices of wider matrices
def test_fused_chains_match_float64(instance, dtype, shape, x_cols, r_cols):
    torch = pytest.importorskip("torch")
    t = getattr(torch, dtype)
    rtol, atol = TOLERANCE[dtype]

    def matrix(wide_cols):
        m = (torch.randn(shape[0], wide_cols or shape[1], device="cuda") * 2).to(t)
        return m[:, :shape[1]]

    x, r = matrix(x_cols), matrix(r_cols)
    b, w = torch.randn(shape[-1], device="cuda").to(t), torch.rand(shape[-1], device="cuda").add(0.5).to(t)
    xd, rd, bd, wd = x.double(), r.double(), b.double(), w.double()

    y = torch.full_like(x, math.nan)
    instance.bias_gelu_residual(x, r, b, out=y)
    z = xd + bd
    g = z * (1 + torch.erf(z / math.sqrt(2))) / 2
    assert ((y.double() - (g + rd)).abs() <= atol + rtol * (g.abs() + rd.abs() + xd.abs() + bd.abs())).all()

    y = torch.full_like(x, math.nan)
    instance.residual_rmsnorm(x, r, w, out=y)
    h = xd + rd
    inv = torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-5)
    assert ((y.double() - h * inv * wd).abs() <= atol + rtol * (xd.abs() + rd.abs()) * inv * wd.abs()).all()


@pytest.mark.parametrize("stride", [2**30 + 64, 2**30 + 65])   # whole packs apart; one element at a time
def test_the_flat_walk_indexes_in_64_bits_where_rows_reach_past_2_to_the_31(stride, device_target):
    """Three rows 2^30 elements apart reach past 2^31 elements: the flat walk's 64-bit index
    path (every other test stays in 32 bits), with packs and, for an odd stride, without."""
    from aicg import codegen, nvrtc
    from aicg.semantics import ruleset
    from aicg.validate import validate_on_device
    from doit_project import REPO
    rules = ruleset.load(REPO / "rulesets")
    family = rules.families["bias_gelu_residual_map"]
    params = {"threads": 256, "vec_bytes": 16, "topology": "flat", "fast_exp": False, "cache_packs": 0}
    source = codegen.source("flat", family, "bfloat16", params)
    cubin = nvrtc.compile_cubin(source, "flat.cu", nvrtc.include_closure(family.header, REPO / "kernels"),
                                device_target.arch)[0]
    result = validate_on_device(cubin, device_target, "bias_gelu_residual", "bfloat16",
                                params, tolerance=rules.presets["tolerance"].tolerance["bfloat16"], deterministic=True,
                                bitwise=False, check_shapes=[(3, 64, stride)], timed_shapes=[], trials=1,
                                repetitions=1)
    assert result["status"] == "passed", result
