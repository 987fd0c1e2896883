"""An instance's operators as functions with signatures, and as PyTorch custom operators
(aicg/runtime/torch_ops.py): registration, fake tensors and shapes on the meta device,
torch.compile with no graph break, and the backward formulas, on a machine with no GPU.

The instances here are manifests without cubins (a kernel is never launched); where a test
needs values, a float64 stand-in (aicg/ops.py's reference) takes the kernels' place.
"""
from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import aicg
from aicg import hw
from aicg.ops import OPERATORS
from aicg.runtime import torch_ops
from doit_project import REPO, profile_text

ALL_OPS = tuple(OPERATORS)


def make_instance(root: Path, ops=ALL_OPS, dtypes=("float32", "bfloat16"), name: str = "h200-test",
                  preservation: str = "tolerance") -> Path:
    """An instance directory as `doit build` leaves it, less the cubins: a manifest whose kernels
    all passed validation, and the planning snapshot (profile, rule sets, hwdb entry)."""
    source = root / "source"
    shutil.copytree(REPO / "rulesets", source / "rulesets", ignore=shutil.ignore_patterns("profiles"))
    (source / "hwdb").mkdir()
    shutil.copy(REPO / "hwdb/nvidia-h200.toml", source / "hwdb")
    (source / "profile.toml").write_text(profile_text(ops=ops, dtypes=dtypes, preservation=preservation))
    kernels = {f"{op}.{d}": {"op": op, "dtype": d, "validation": "passed"} for op in ops for d in dtypes}
    target = hw.load(REPO / "hwdb/nvidia-h200.toml")
    (root / "manifest.json").write_text(json.dumps({"instance": name, "kernels": kernels,
                                                    "target": {"name": target.name, "arch": target.arch}}))
    return root


class Float64Kernels:
    """Stands in for an operator's kernels on the host: aicg/ops.py's float64 reference,
    rounded to x's dtype, called as OpKernels is."""

    def __init__(self, name: str, entries: dict | None = None):
        self.op, self.entries = OPERATORS[name], dict(entries or {})   # entries: the kernels' by dtype
        self.calls = 0

    def __call__(self, x, *inputs, out=None, stream=None, **scalars):
        import torch
        self.calls += 1
        op, cols = self.op, x.shape[-1]
        args = {"x": x.detach().reshape(-1, cols).double().numpy()}
        for name, t in zip((*op.matrices, *op.vectors), inputs):
            value = t.detach().double().numpy()
            args[name] = value.reshape(-1, cols) if name in op.matrices else value
        y, _ = op.reference(**args, **{**dict(op.scalars), **scalars})
        y = torch.from_numpy(np.asarray(y, dtype=np.float64)).to(x.dtype)
        y = y.reshape(tuple(x.shape) if op.output == "matrix" else tuple(x.shape[:-1]))
        if out is None:
            return y
        out.copy_(y)
        return out


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def instance(tmp_path, torch):
    return aicg.load(make_instance(tmp_path / "instance"))


# --- without PyTorch -------------------------------------------------------------------

@pytest.mark.parametrize("without", ["torch_ops.torch_installed = lambda: False",   # not installed
                                     "sys.modules['torch'] = None"])                 # installed, does not import
def test_import_aicg_and_load_need_no_torch(tmp_path, without):
    """`import aicg` never imports torch; without it an instance's operators are still functions
    with their signatures, and no namespace is registered."""
    path = make_instance(tmp_path / "instance", ops=("rmsnorm",), dtypes=("float32",))
    code = ("import sys, inspect, aicg\n"
            "assert 'torch' not in sys.modules\n"
            "from aicg.runtime import torch_ops\n"
            f"{without}\n"
            f"inst = aicg.load({str(path)!r})\n"
            "assert inst.namespace is None and not sys.modules.get('torch')\n"
            "print(inspect.signature(inst.rmsnorm), 'rmsnorm' in dir(inst))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "(x, w, *, eps=1e-05, out=None, stream=None) True"


def test_each_operator_has_its_signature_and_a_docstring(instance):
    expected = {"softmax": "(x, *, out=None, stream=None)",
                "row_max": "(x, *, out=None, stream=None)",
                "rmsnorm": "(x, w, *, eps=1e-05, out=None, stream=None)",
                "layernorm": "(x, w, b, *, eps=1e-05, out=None, stream=None)",
                "bias_gelu_residual": "(x, r, b, *, out=None, stream=None)",
                "residual_rmsnorm": "(x, r, w, *, eps=1e-05, out=None, stream=None)"}
    for name, text in expected.items():
        function = getattr(instance, name)
        assert str(inspect.signature(function)) == text
        assert function.__name__ == name
        doc = inspect.getdoc(function)
        assert doc.startswith(name + text)
        assert "in bfloat16, float32 (the dtypes this instance has kernels for)" in doc
        assert f"torch.ops.{instance.namespace}.{name}" in doc
    assert "y_ij = x_ij / sqrt(mean_k x_ik^2 + eps) * w_j" in instance.rmsnorm.__doc__   # the atlas's form
    assert "(...,), one value a row" in instance.row_sum.__doc__


def test_dir_lists_the_operators_and_an_unknown_one_is_explained(instance):
    assert set(ALL_OPS) <= set(dir(instance))
    assert {"tune", "path", "namespace"} <= set(dir(instance))
    with pytest.raises(AttributeError, match="has no operator 'gelu'"):
        instance.gelu


def test_the_namespace_is_the_instance_name_and_each_load_gets_its_own(tmp_path, torch):
    path = make_instance(tmp_path / "instance", ops=("softmax",), dtypes=("float32",), name="H200 fused-v2")
    first, second = aicg.load(path), aicg.load(path)
    assert first.namespace.startswith("aicg_h200_fused_v2")
    assert second.namespace == first.namespace + "_2" or second.namespace.startswith("aicg_h200_fused_v2_")
    assert first.namespace != second.namespace
    for inst in (first, second):   # each namespace calls its own instance's kernels
        inst.ops["softmax"] = Float64Kernels("softmax")
        getattr(torch.ops, inst.namespace).softmax(torch.randn(2, 3))
        assert inst.ops["softmax"].calls == 1


# --- registration and fake tensors -------------------------------------------------------

def test_schemas_follow_the_operator_registry(instance, torch):
    ops = getattr(torch.ops, instance.namespace)
    assert str(ops.residual_rmsnorm.default._schema).endswith(
        "::residual_rmsnorm(Tensor x, Tensor r, Tensor w, *, float eps=1.0000000000000001e-05) -> Tensor")
    assert str(ops.layernorm_out.default._schema).endswith(
        "::layernorm_out(Tensor x, Tensor w, Tensor b, Tensor(a!) out, *, float eps=1.0000000000000001e-05) -> ()")
    assert str(ops.row_sum.default._schema).endswith("::row_sum(Tensor x) -> Tensor")


@pytest.mark.parametrize("name", ALL_OPS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_meta_tensors_get_the_output_shape_and_dtype(instance, torch, name, dtype):
    op = OPERATORS[name]
    t = getattr(torch, dtype)
    x = torch.empty(2, 7, 48, device="meta", dtype=t)
    inputs = [torch.empty(2, 7, 48, device="meta", dtype=t) for _ in op.matrices]
    inputs += [torch.empty(48, device="meta", dtype=t) for _ in op.vectors]
    y = getattr(instance, name)(x, *inputs)
    assert y.device.type == "meta" and y.dtype == t
    assert tuple(y.shape) == ((2, 7, 48) if op.output == "matrix" else (2, 7))
    out = torch.empty(tuple(y.shape), device="meta", dtype=t)
    assert getattr(instance, name)(x, *inputs, out=out) is out


def test_the_fake_implementation_checks_shapes_as_the_kernels_do(instance, torch):
    x = torch.empty(4, 64, device="meta", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"w: expected shape \(64,\) and dtype torch.bfloat16, got \(32,\)"):
        instance.rmsnorm(x, torch.empty(32, device="meta", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="r: expected shape"):
        instance.residual_rmsnorm(x, x[:2], torch.empty(64, device="meta", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out: expected shape"):
        instance.row_sum(x, out=torch.empty(4, 64, device="meta", dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"rmsnorm takes x and 1 more input\(s\) \(w\), got 0"):
        instance.rmsnorm(x)
    with pytest.raises(TypeError, match="softmax has no argument 'eps'"):
        instance.softmax(x, eps=1e-5)


def test_host_tensors_are_refused_with_the_kernels_message(instance, torch):
    with pytest.raises(TypeError, match="expected an array in GPU memory"):
        instance.softmax(torch.randn(3, 4))


def test_a_direct_launch_is_taken_only_for_plain_cuda_tensors_that_need_no_gradient(torch):
    from torch._subclasses.fake_tensor import FakeTensorMode
    launch_directly = torch_ops.direct_launch_check(torch)
    assert not launch_directly((torch.randn(2, 3),))                       # not on a GPU
    assert not launch_directly((torch.empty(2, 3, device="meta"),))
    with FakeTensorMode() as mode:
        assert not launch_directly((mode.from_tensor(torch.empty(2, 3, device="meta")),))
    if torch.cuda.is_available():
        x = torch.randn(2, 3, device="cuda")
        assert launch_directly((x,))
        assert not launch_directly((x, torch.randn(3, device="cuda").requires_grad_()))
        with torch.no_grad():
            assert launch_directly((x.requires_grad_(),))


def test_opcheck_passes_on_the_functional_and_out_operators(instance, torch):
    """PyTorch's own consistency checks of a custom operator (schema, fake tensor, autograd
    registration, AOT dispatch), with the float64 stand-in running it on the host."""
    for name in ("layernorm", "row_max", "bias_gelu_residual"):
        instance.ops[name] = Float64Kernels(name)
    ops = getattr(torch.ops, instance.namespace)
    x, r = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    w, b = torch.rand(5, dtype=torch.float64) + 0.5, torch.randn(5, dtype=torch.float64)
    checks = [(ops.layernorm.default, (x.requires_grad_(), w, b), {"eps": 1e-3}),
              (ops.row_max.default, (x,), {}),
              (ops.bias_gelu_residual_out.default, (x.detach(), r, b, torch.empty(3, 5, dtype=torch.float64)), {})]
    for op, args, kwargs in checks:
        results = torch.library.opcheck(op, args, kwargs)
        assert set(results.values()) == {"SUCCESS"}, (op, results)


# --- torch.compile -----------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor compiles host code with g++")
def test_inductor_compiles_instance_operators_forward_and_backward_as_eager_runs_them(instance, torch):
    """Inductor (on the host, with the float64 stand-ins) calls each operator as a kernel of its
    own, in an inference graph and in a training graph through the registered backward."""
    for name in ("layernorm", "softmax"):
        instance.ops[name] = Float64Kernels(name)

    def block(x, w, b):
        return instance.softmax(instance.layernorm(x, w, b) * 2) + 1

    generator = torch.Generator().manual_seed(3)
    x, b = (torch.randn(*shape, dtype=torch.float64, generator=generator) for shape in ((4, 16), (16,)))
    w = torch.rand(16, dtype=torch.float64, generator=generator) + 0.5
    with torch.no_grad():
        assert torch.equal(torch.compile(block, fullgraph=True)(x, w, b), block(x, w, b))
    grads = []
    for run in (block, torch.compile(block, fullgraph=True)):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        (run(xs, ws, b) * torch.arange(16, dtype=torch.float64)).sum().backward()
        grads.append((xs.grad, ws.grad))
    assert torch.allclose(grads[0][0], grads[1][0]) and torch.allclose(grads[0][1], grads[1][1])


def test_torch_compile_traces_an_out_call_as_a_functional_one(instance, torch):
    """out= is an operator that writes into its argument: AOTAutograd turns it into a functional
    call and a copy, so a compiled function may write into a buffer of its own."""
    def fill(x, buffer):
        instance.softmax(x, out=buffer)
        return buffer * 2

    x, buffer = (torch.empty(4, 64, device="meta", dtype=torch.bfloat16) for _ in range(2))
    assert torch._dynamo.explain(fill)(x, buffer).graph_break_count == 0
    assert tuple(torch.compile(fill, fullgraph=True, backend="aot_eager")(x, buffer).shape) == (4, 64)


def test_torch_compile_traces_instance_operators_with_no_graph_break(instance, torch):
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def block(x, r, w, b):
        h = instance.bias_gelu_residual(x, r, b)
        return instance.row_sum(instance.rmsnorm(instance.softmax(h) * 2, w, eps=1e-6)), instance.layernorm(x, w, b)

    t = torch.bfloat16
    args = (torch.empty(3, 8, 64, device="meta", dtype=t), torch.empty(3, 8, 64, device="meta", dtype=t),
            torch.empty(64, device="meta", dtype=t), torch.empty(64, device="meta", dtype=t))
    explained = torch._dynamo.explain(block)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    total, normed = torch.compile(block, fullgraph=True, backend=record)(*args)
    assert tuple(total.shape) == (3, 8) and tuple(normed.shape) == (3, 8, 64)
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    ns = instance.namespace
    assert [t for t in targets if t.startswith(ns)] == [f"{ns}.{name}.default" for name in
                                                         ("bias_gelu_residual", "softmax", "rmsnorm", "row_sum",
                                                          "layernorm")]
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")   # through AOTAutograd as well
    assert tuple(compiled(*args)[0].shape) == (3, 8)


def test_out_variant_traces_as_a_mutation(instance, torch):
    def f(x, w, out):
        instance.rmsnorm(x, w, out=out)
        return out * 2

    x = torch.empty(4, 32, device="meta")
    out = torch.empty(4, 32, device="meta")
    y = torch.compile(f, fullgraph=True, backend="aot_eager")(x, torch.empty(32, device="meta"), out)
    assert tuple(y.shape) == (4, 32)


# --- backward ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL_OPS)
def test_gradients_match_finite_differences_of_the_forward(instance, torch, name):
    """gradcheck in float64: the backward formula against finite differences of the forward
    (here the float64 reference standing in for the kernel)."""
    instance.ops[name] = Float64Kernels(name)
    op = OPERATORS[name]
    generator = torch.Generator().manual_seed(7)
    make = lambda *shape: torch.randn(*shape, dtype=torch.float64, generator=generator).requires_grad_()
    inputs = [make(2, 3, 6)] + [make(2, 3, 6) for _ in op.matrices]
    inputs += [(torch.rand(6, dtype=torch.float64, generator=generator) + 0.5).requires_grad_()
               if v == "w" else make(6) for v in op.vectors]
    function = getattr(torch.ops, instance.namespace).__getattr__(name)
    assert torch.autograd.gradcheck(lambda *a: function(*a), tuple(inputs))


def test_backward_runs_in_float32_for_bfloat16_inputs_and_casts_back(instance, torch):
    instance.ops["rmsnorm"] = Float64Kernels("rmsnorm")
    x = torch.randn(4, 16).to(torch.bfloat16).requires_grad_()
    w = (torch.rand(16) + 0.5).to(torch.bfloat16).requires_grad_()
    instance.rmsnorm(x, w, eps=1e-6).float().square().sum().backward()
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-6) * wd
    y.to(torch.bfloat16).double().square().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    assert torch.allclose(x.grad.double(), xd.grad, rtol=3e-2, atol=1e-2)
    assert torch.allclose(w.grad.double(), wd.grad, rtol=3e-2, atol=1e-2)


def test_out_is_not_differentiable(instance, torch):
    instance.ops["softmax"] = Float64Kernels("softmax")
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"softmax\(\.\.\., out=\.\.\.\) is not differentiable"):
        instance.softmax(x, out=torch.empty(2, 3))


def test_a_call_repeating_an_earlier_ones_signature_launches_with_its_own_arrays_and_scalars(instance, torch,
                                                                                           monkeypatch):
    """A second call with the shapes, strides, dtypes and GPU of the first launches the kernel
    serving that shape with no argument worked out again, on its own pointers, scalars and a new
    output; another signature goes the whole way. (Tensors that say they are on a GPU stand in for
    CUDA tensors: the launch is recorded, not made.)"""
    from aicg.runtime import arrays

    class OnGpu(torch.Tensor):
        is_cuda = property(lambda self: True)

    launches, views = [], []
    names = ("x", "w", "y", "rows", "cols", "x_stride", "eps")
    kernels = instance.ops["rmsnorm"]
    monkeypatch.setattr(kernels, "_launch_for", lambda dtype, device, rows, cols: (
        lambda grid, block, values, stream, shared: launches.append(dict(zip(names, values))), names, (rows, 1, 1),
        (128, 1, 1), 0))
    view = arrays.view
    monkeypatch.setattr(arrays, "view", lambda obj, what: views.append(what) or view(obj, what))
    monkeypatch.setattr(arrays, "current_stream", lambda like: 7)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)

    def tensor(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16).as_subclass(OnGpu)

    w = tensor(64)
    first = kernels(tensor(4, 64), w, eps=1e-5)
    assert views == ["x", "w"] and len(launches) == 1
    x = tensor(4, 64)
    second = kernels(x, w, eps=1e-3)
    assert len(views) == 2 and len(launches) == 2      # nothing read again
    assert launches[1] == {"x": x.data_ptr(), "w": w.data_ptr(), "y": second.data_ptr(), "rows": 4, "cols": 64,
                           "x_stride": 64, "eps": 1e-3}
    assert second.shape == first.shape == (4, 64) and second.data_ptr() != first.data_ptr()
    wide = tensor(4, 80)[:, :64]                          # rows 80 elements apart: worked out anew
    kernels(wide, w)
    assert len(views) == 4 and launches[2]["x_stride"] == 80
    with pytest.raises(ValueError, match="w: expected shape"):
        kernels(x, tensor(32))                            # its checks still run where the signature is new
