"""GPU test: the backward kernels (aicg/backward/) against float64 gradients, and through autograd.

Each case runs the instance's backward kernels on drawn inputs (awkward sizes, rows lying apart)
and compares every gradient with PyTorch's float64 autograd on the same rounded inputs, within the
bound validation holds them to (|y - ref| <= atol + rtol * scale, aicg/backward/ops.py). The
kernels are compiled on the first call at a row length and validated on the device first; a case
where the kernels declined fails with the reason. Then the autograd path: gradients through the
instance's custom operators eagerly, through torch.compile (AOTAutograd), a CUDA graph of the
backward replaying, the bits repeating, and one instance built with `doit build` end to end.

The instances for the kernel cases are manifests without forward cubins (their forward is a
float64 stand-in on the GPU), built for this machine's GPU. Skipped without a GPU that hwdb/ has an
entry for; run on the device with `pytest -m gpu tests/test_gpu_backward.py`.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from aicg.backward.ops import BY_FORWARD, draw, reference
from aicg.dtypes import DTYPES
from doit_project import REPO, doit, instance_dir, make_project, profile_text

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("device_target")]

TOLERANCE = {"float32": (1e-5, 1e-7), "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}   # the tolerance preset's
# (rows, cols) or (rows, cols, row stride): off every pack and block, several rows a thread's group,
# one row of many, long rows, rows lying apart with and without packs; rows a block (or a cluster,
# on GPUs with them) holds whole, in several chunks (the norms' column sums in the rows' own pass)
SHAPES = [(3, 1), (5, 7), (2051, 3), (3001, 33), (37, 1000), (9, 4097), (2, 20000), (37, 1000, 1024), (9, 515, 517),
          (300, 4096), (130, 2048, 2056), (200, 16384)]
OPS = tuple(BY_FORWARD)


class Float64Forward:
    """The forward on the GPU in float64, rounded to x's dtype: what the manifest-only instance runs
    in place of forward kernels (the backward kernels are what is tested here)."""

    def __init__(self, name: str):
        self.name, self.entries = name, {}

    def __call__(self, x, *inputs, out=None, stream=None, eps=1e-5):
        xd = x.double()
        if self.name == "softmax":
            y = torch.softmax(xd, -1)
        elif self.name == "log_softmax":
            y = torch.log_softmax(xd, -1)
        elif self.name == "rmsnorm":
            y = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + eps) * inputs[0].double()
        else:
            y = torch.nn.functional.layer_norm(xd, (x.shape[-1],), inputs[0].double(), inputs[1].double(), eps)
        y = y.to(x.dtype)
        return y if out is None else out.copy_(y)


def _instance_dir(root, device_target):
    """An instance directory for this machine's GPU: the planning snapshot and a manifest of
    validated forward kernels without their cubins (their forward never launches)."""
    source = root / "source"
    shutil.copytree(REPO / "rulesets", source / "rulesets", ignore=shutil.ignore_patterns("profiles"))
    (source / "hwdb").mkdir()
    shutil.copy(REPO / f"hwdb/{device_target.target}.toml", source / "hwdb")
    text = profile_text(ops=OPS, dtypes=tuple(TOLERANCE), extra="[validation]\ntrials = 2\n")
    (source / "profile.toml").write_text(text.replace('target = "nvidia-h200"', f'target = "{device_target.target}"'))
    kernels = {f"{op}.{d}": {"op": op, "dtype": d, "validation": "passed"} for op in OPS for d in TOLERANCE}
    (root / "manifest.json").write_text(json.dumps({"instance": "backward-test", "kernels": kernels}))
    return root


@pytest.fixture(scope="module")
def instance(tmp_path_factory, device_target):
    import aicg
    inst = aicg.load(_instance_dir(tmp_path_factory.mktemp("gpu_backward"), device_target))
    for name in OPS:
        inst.ops[name] = Float64Forward(name)
    return inst


def _inputs(name: str, dtype_name: str, shape, trial: int = 1, seed: int = 0):
    """Drawn inputs as stored (numpy) and as CUDA tensors; matrices rows `shape[2]` apart if given."""
    rows, cols, *stride = shape
    op, dtype = BY_FORWARD[name], DTYPES[dtype_name]
    stored = draw(op, dtype, rows, cols, trial, np.random.default_rng(seed))
    t = getattr(torch, dtype_name)
    tensors = {}
    for key, value in stored.items():
        dense = torch.from_numpy(dtype.decode(value).reshape(value.shape)).to("cuda").to(t)   # exact: already rounded
        if key in op.matrices and stride:
            wide = torch.full((rows, stride[0]), float("nan"), device="cuda", dtype=t)
            wide[:, :cols] = dense
            dense = wide[:, :cols]
        tensors[key] = dense
    return stored, tensors


def _float64_gradients(name: str, tensors: dict) -> dict:
    """PyTorch's autograd in float64 on the same rounded inputs."""
    g = tensors["g"].double()
    if name == "softmax":
        return {"dx": torch._softmax_backward_data(g, tensors["y"].double(), -1, torch.float64)}
    if name == "log_softmax":
        return {"dx": torch._log_softmax_backward_data(g, tensors["y"].double(), -1, torch.float64)}
    x = tensors["x"].double().requires_grad_()
    w = tensors["w"].double().requires_grad_()
    cols = x.shape[-1]
    if name == "rmsnorm":
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * w
        return dict(zip(("dx", "dw"), torch.autograd.grad(y, (x, w), g)))
    b = torch.zeros(cols, dtype=torch.float64, device="cuda", requires_grad=True)
    y = torch.nn.functional.layer_norm(x, (cols,), w, b, 1e-5)
    return dict(zip(("dx", "dw", "db"), torch.autograd.grad(y, (x, w, b), g)))


def _run(instance, name: str, tensors: dict):
    op = BY_FORWARD[name]
    found = instance.backward(name, tensors["g"], tensors[op.saved], *(tensors[v] for v in op.vectors),
                              **({"eps": 1e-5} if op.scalars else {}), weight_grads=True)
    assert found is not None, instance.backward.declined
    return dict(zip(op.outputs, found))


def _within_bound(name: str, dtype_name: str, stored: dict, found: dict, expected: dict) -> None:
    scales = {output: scale for output, (_, scale) in reference(BY_FORWARD[name], DTYPES[dtype_name], stored).items()}
    assert set(expected) == set(scales) == set(found)
    for output, want in expected.items():
        scale = scales[output]
        got = found[output].double().cpu().numpy()
        bound = TOLERANCE[dtype_name][1] + TOLERANCE[dtype_name][0] * scale
        error = np.abs(got - want.detach().cpu().numpy())
        assert np.all(error <= bound), (output, float(np.max(error / bound)))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", OPS)
def test_the_backward_kernels_match_float64_gradients(instance, name, dtype, shape):
    stored, tensors = _inputs(name, dtype, shape)
    found = _run(instance, name, tensors)
    _within_bound(name, dtype, stored, found, _float64_gradients(name, tensors))
    rows, cols = shape[0], shape[1]
    assert instance.backward.served[(name, dtype, rows, cols)]


@pytest.mark.parametrize("name", OPS)
def test_float16_and_both_distributions(instance, name):
    for trial in (0, 1):
        stored, tensors = _inputs(name, "float16", (300, 768), trial=trial, seed=trial)
        _within_bound(name, "float16", stored, _run(instance, name, tensors), _float64_gradients(name, tensors))


@pytest.mark.parametrize("name", OPS)
def test_the_bits_repeat(instance, name):
    _, tensors = _inputs(name, "bfloat16", (4099, 1536))
    first, second = _run(instance, name, tensors), _run(instance, name, tensors)
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_validation_ran_on_this_gpu_before_the_first_launch(instance):
    _run(instance, "softmax", _inputs("softmax", "bfloat16", (100, 300))[1])
    validated = [e for e in instance.backward.events if "validated" in e]
    assert validated and {e["validated"] for e in validated} <= {"passed", "failed"}
    assert all(e.get("reason") for e in validated if e["validated"] == "failed")
    served = set(instance.backward.served.values())
    failed = {e["candidate"] for e in validated if e["validated"] == "failed"}
    assert served and not served & failed


# --- through autograd ---------------------------------------------------------------------------

def _forward(instance, name: str, x, w, b):
    if name in ("softmax", "log_softmax"):
        return getattr(instance, name)(x)
    return instance.rmsnorm(x, w, eps=1e-5) if name == "rmsnorm" else instance.layernorm(x, w, b, eps=1e-5)


def _leaves(dtype, rows=64, cols=1000, seed=2):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, cols, device="cuda", generator=generator) * 2).to(dtype).requires_grad_()
    w = (torch.rand(cols, device="cuda", generator=generator) + 0.5).to(dtype).requires_grad_()
    b = torch.randn(cols, device="cuda", generator=generator).to(dtype).requires_grad_()
    g = torch.randn(rows, cols, device="cuda", generator=generator).to(dtype)
    return x, w, b, g


def _float64_leaf_gradients(name, x, w, b, g):
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    cols = x.shape[-1]
    y = {"softmax": lambda: torch.softmax(xd, -1), "log_softmax": lambda: torch.log_softmax(xd, -1),
         "rmsnorm": lambda: xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-5) * wd,
         "layernorm": lambda: torch.nn.functional.layer_norm(xd, (cols,), wd, bd, 1e-5)}[name]()
    leaves = {"softmax": (xd,), "log_softmax": (xd,), "rmsnorm": (xd, wd), "layernorm": (xd, wd, bd)}[name]
    return torch.autograd.grad(y, leaves, g.double())


def _close(got, want) -> float:
    """Normwise relative error (the forward's rounding of y reaches the gradient of softmax's x)."""
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", OPS)
def test_autograd_through_the_instance_operators_runs_the_kernels(instance, name, dtype):
    x, w, b, g = _leaves(dtype)
    leaves = {"softmax": (x,), "log_softmax": (x,), "rmsnorm": (x, w), "layernorm": (x, w, b)}[name]
    found = torch.autograd.grad(_forward(instance, name, x, w, b), leaves, g)
    expected = _float64_leaf_gradients(name, x, w, b, g)
    rtol = 1e-4 if dtype == torch.float32 else 3e-2
    for got, want in zip(found, expected):
        assert got.dtype == dtype and _close(got, want) <= rtol
    assert (name, str(dtype).rsplit(".", 1)[-1], 64, 1000) in instance.backward.served


def test_torch_compile_runs_the_backward_kernels(instance):
    x, w, b, g = _leaves(torch.bfloat16, seed=4)

    def f(x, w, b):
        return instance.layernorm(instance.softmax(x), w, b, eps=1e-5) + instance.rmsnorm(x, w, eps=1e-5)

    instance.backward.served.clear()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    found = torch.autograd.grad(compiled(x, w, b), (x, w, b), g)
    assert {k[0] for k in instance.backward.served} == {"softmax", "layernorm", "rmsnorm"}
    eager = torch.autograd.grad(f(x, w, b), (x, w, b), g)
    for got, want in zip(found, eager):
        assert torch.equal(got, want)      # the same kernels on the same inputs


def test_a_cuda_graph_of_the_backward_replays(instance):
    _, tensors = _inputs("layernorm", "bfloat16", (512, 2048))
    args = (tensors["g"], tensors["x"], tensors["w"])
    expected = instance.backward("layernorm", *args, eps=1e-5, weight_grads=True)   # warm-up: compiles, validates
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        instance.backward("layernorm", *args, eps=1e-5, weight_grads=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = instance.backward("layernorm", *args, eps=1e-5, weight_grads=True)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(captured, expected))


# --- an instance built with its forward kernels ---------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory, device_target):
    import aicg
    profile = profile_text(ops=OPS, dtypes=("bfloat16",), shapes=((256, 1024),), per_family=1,
                           extra="[validation]\ntiming_repetitions = 3\n")
    project = make_project(tmp_path_factory.mktemp("gpu_backward_built"), profile)
    run = doit(project, "build", "profile=rulesets/profiles/small.toml", "target=auto")
    assert run.code == 0, run.output
    return aicg.load(instance_dir(project, device_target.target))


@pytest.mark.parametrize("name", OPS)
def test_a_built_instance_trains_through_its_own_forward_and_backward_kernels(built, name):
    x, w, b, g = _leaves(torch.bfloat16, rows=256, cols=1024, seed=6)
    leaves = {"softmax": (x,), "log_softmax": (x,), "rmsnorm": (x, w), "layernorm": (x, w, b)}[name]
    found = torch.autograd.grad(_forward(built, name, x, w, b), leaves, g)
    for got, want in zip(found, _float64_leaf_gradients(name, x, w, b, g)):
        assert _close(got, want) <= 3e-2
    assert (name, "bfloat16", 256, 1024) in built.backward.served, built.backward.declined
    assert built.ops[name].chosen, "the forward ran no kernel of the instance"
