"""The backward kernels wired to autograd (aicg/runtime/torch_ops.py, aicg/backward/runtime.py) and
their JIT (aicg/backward/jit.py), on a machine with no GPU: the `<op>_backward` operators and their
fake implementations on the meta device, in the graphs torch.compile's AOTAutograd traces, and
PyTorch's formula where the kernels cannot serve a call, with the reason kept. The JIT compiles
and caches on the host; without a GPU nothing it compiled is validated, so nothing runs.

The instances are manifests without cubins (tests/test_torch_ops.py); where values are needed, a
float64 stand-in takes the forward kernels' place."""
from __future__ import annotations

import json

import pytest

import aicg
from aicg import nvrtc
from aicg.backward.ops import BY_FORWARD
from test_torch_ops import Float64Kernels, make_instance

WITH_KERNELS = tuple(sorted(BY_FORWARD))


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def instance(tmp_path, torch):
    return aicg.load(make_instance(tmp_path / "instance"))


def test_the_operators_with_backward_kernels_get_a_backward_operator(instance, torch):
    ops = getattr(torch.ops, instance.namespace)
    schemas = {name: str(getattr(ops, f"{name}_backward").default._schema).split("::", 1)[1] for name in WITH_KERNELS}
    assert schemas == {
        "softmax": "softmax_backward(Tensor g, Tensor y) -> Tensor",
        "log_softmax": "log_softmax_backward(Tensor g, Tensor y) -> Tensor",
        "rmsnorm": "rmsnorm_backward(Tensor g, Tensor x, Tensor w, *, float eps, bool weight_grads) -> (Tensor, Tensor)",
        "layernorm": ("layernorm_backward(Tensor g, Tensor x, Tensor w, *, float eps, bool weight_grads) -> "
                      "(Tensor, Tensor, Tensor)")}
    for name in ("row_sum", "row_max", "bias_gelu_residual", "residual_rmsnorm"):
        assert not hasattr(ops, f"{name}_backward")
        assert "PyTorch's formula" in getattr(instance, name).__doc__
    assert f"torch.ops.{instance.namespace}.rmsnorm_backward" in instance.rmsnorm.__doc__


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_meta_tensors_get_gradients_of_their_inputs_shapes(instance, torch, dtype):
    t = getattr(torch, dtype)
    x = torch.empty(2, 5, 48, device="meta", dtype=t, requires_grad=True)
    w = torch.empty(48, device="meta", dtype=t, requires_grad=True)
    b = torch.empty(48, device="meta", dtype=t, requires_grad=True)
    y = instance.layernorm(instance.log_softmax(instance.softmax(x)), w, b) + instance.rmsnorm(x, w)
    y.sum().backward()
    assert (x.grad.shape, w.grad.shape, b.grad.shape) == ((2, 5, 48), (48,), (48,))
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == t and x.grad.device.type == "meta"
    ops = getattr(torch.ops, instance.namespace)
    g = torch.empty(2, 5, 48, device="meta", dtype=t)
    dx, dw, db = ops.layernorm_backward(g, x.detach(), w.detach(), eps=1e-5, weight_grads=False)
    assert tuple(dx.shape) == (2, 5, 48) and tuple(dw.shape) == tuple(db.shape) == (0,)


def test_aot_autograd_traces_the_backward_operators(instance, torch):
    """The backward graph torch.compile hands its compiler calls `<op>_backward`; a weight that
    needs no gradient is not summed over."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function
    graphs = []

    def compiler(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def f(x, w, b):
        return (instance.layernorm(instance.softmax(x), w, b).sum() + instance.rmsnorm(x, w.detach()).sum()
                + instance.log_softmax(x).sum())

    x = torch.empty(4, 8, 32, device="meta", requires_grad=True)
    w = torch.empty(32, device="meta", requires_grad=True)
    b = torch.empty(32, device="meta", requires_grad=True)
    aot_function(f, fw_compiler=compiler, bw_compiler=compiler)(x, w, b).backward()
    assert x.grad.shape == (4, 8, 32) and w.grad.shape == b.grad.shape == (32,)
    forward, backward = graphs
    ns = instance.namespace
    called = {str(n.target): n for n in backward.graph.nodes if n.op == "call_function" and ns in str(n.target)}
    assert set(called) == {f"{ns}.{name}_backward.default" for name in WITH_KERNELS}
    assert called[f"{ns}.layernorm_backward.default"].kwargs["weight_grads"] is True
    assert called[f"{ns}.rmsnorm_backward.default"].kwargs["weight_grads"] is False


def test_off_the_gpu_the_formula_serves_and_the_reason_is_kept(instance, torch):
    instance.ops["rmsnorm"] = Float64Kernels("rmsnorm")
    x = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(16, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: instance.rmsnorm(a, b), (x, w))
    assert instance.backward.declined == {("rmsnorm", "float64", 16): "the tensors are not on a CUDA device"}
    assert instance.backward.served == {}


@pytest.mark.parametrize("name", WITH_KERNELS)
def test_the_backward_operators_pass_pytorchs_checks_and_second_derivatives_use_the_formula(instance, torch, name):
    instance.ops[name] = Float64Kernels(name)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 8, dtype=torch.float64, generator=generator, requires_grad=True)
    w = (torch.rand(8, dtype=torch.float64, generator=generator) + 0.5).requires_grad_()
    b = torch.randn(8, dtype=torch.float64, generator=generator, requires_grad=True)
    inputs = {"softmax": (x,), "log_softmax": (x,), "rmsnorm": (x, w), "layernorm": (x, w, b)}[name]
    function = getattr(getattr(torch.ops, instance.namespace), name)
    assert torch.autograd.gradgradcheck(lambda *a: function(*a), inputs)     # create_graph: the formula
    ops = getattr(torch.ops, instance.namespace)
    g = torch.randn(2, 3, 8, dtype=torch.float64, generator=generator)
    saved = x.detach() if name in ("rmsnorm", "layernorm") else function(x.detach())
    args = (g, saved, w.detach()) if name in ("rmsnorm", "layernorm") else (g, saved)
    kwargs = {"eps": 1e-5, "weight_grads": True} if name in ("rmsnorm", "layernorm") else {}
    results = torch.library.opcheck(getattr(ops, f"{name}_backward").default, args, kwargs)
    assert set(results.values()) == {"SUCCESS"}, results


# --- the JIT on the host ----------------------------------------------------------------------

def test_without_a_gpu_a_backward_kernel_is_not_validated_and_does_not_serve(tmp_path, torch):
    path = make_instance(tmp_path / "instance")
    jit = aicg.load(path).backward.jit()
    before = nvrtc.compilations
    found = jit.kernel_for("softmax_backward", "bfloat16", 1000, 4096)
    assert isinstance(found, str) and "no GPU on this machine" in found and "allow_unvalidated=True" in found
    assert nvrtc.compilations == before + 1                # the first candidate compiled, then the search stopped
    assert [e.get("validated") for e in jit.events] == [None, "unvalidated"]


def test_the_jit_caches_what_it_compiled_and_an_instance_allowing_unvalidated_kernels_takes_them(tmp_path, torch):
    path = make_instance(tmp_path / "instance")
    jit = aicg.load(path, allow_unvalidated=True).backward.jit()
    chosen = jit.kernel_for("rmsnorm_backward", "float32", 512, 1000)
    assert chosen.origin == "compiled" and chosen.validation == "unvalidated"
    assert chosen.candidate.rows_family == "rmsnorm_backward_rows" and chosen.candidate.columns
    cached = sorted(p.name for p in (path / "jit/backward").iterdir())
    assert len(cached) == 2 and cached[0].endswith(".cubin") and cached[1].endswith(".json")
    record = json.loads((path / "jit/backward" / cached[1]).read_text())
    assert record["id"] == chosen.candidate.id and record["validation"] == {}   # no outcome without the target GPU
    before = nvrtc.compilations
    again = aicg.load(path, allow_unvalidated=True).backward.jit().kernel_for("rmsnorm_backward", "float32", 512, 1000)
    assert (again.origin, again.cubin, nvrtc.compilations) == ("jit cache", chosen.cubin, before)
    (path / "jit/backward" / cached[0]).write_bytes(b"damaged")        # a damaged cubin is compiled again
    third = aicg.load(path, allow_unvalidated=True).backward.jit().kernel_for("rmsnorm_backward", "float32", 512, 1000)
    assert third.origin == "compiled" and third.cubin == chosen.cubin


def test_the_jit_declines_without_a_snapshot_or_a_legal_family(tmp_path, torch):
    assert "jit=False" in aicg.load(make_instance(tmp_path / "a"), jit=False).backward.jit()
    bitwise = aicg.load(make_instance(tmp_path / "b", preservation="bitwise")).backward.jit()
    reason = bitwise.kernel_for("layernorm_backward", "float32", 64, 1000)
    assert reason.startswith("no legal backward family") and "order" in reason


def test_where_the_ladder_offers_two_kinds_the_first_two_of_each_are_timed_and_the_fastest_kept(tmp_path, torch,
                                                                                              monkeypatch):
    """The norms' one-pass and two-pass candidates, validated and timed by stand-ins for the GPU:
    the fastest serves (here the second two-pass one), the choice is kept for the shape class and a
    later process times nothing."""
    from aicg.backward import check
    path = make_instance(tmp_path / "instance")
    validated, timed = [], []
    monkeypatch.setattr(check, "validate_on_device",
                        lambda cubin, candidate, hardware, **kw: validated.append(candidate.id) or {"status": "passed"})

    def time_on_device(kernels, hardware, shape, repetitions):
        timed.append(([c.id for _, c in kernels], tuple(shape)))
        # the two-pass form faster here, and the later of a kind the faster
        return [(2e-3 if c.partials_in_rows else 1e-3) - 1e-6 * i for i, (_, c) in enumerate(kernels)]
    monkeypatch.setattr(check, "time_on_device", time_on_device)

    jit = aicg.load(path).backward.jit()
    chosen = jit.kernel_for("rmsnorm_backward", "bfloat16", 3000, 4096)
    (offered, shape), = timed
    ladder = [c.id for c in jit.candidates("rmsnorm_backward", "bfloat16", 3000, 4096)]
    one_pass, two_pass = ([o for o in ladder if o.startswith(f"{family}.")][:2]
                          for family in (ladder[0].split(".")[0], "rmsnorm_backward_rows"))
    assert sorted(offered) == sorted(one_pass + two_pass) and validated == offered
    assert shape == (3000, 4096) and chosen.candidate.id == two_pass[1] and not chosen.candidate.partials_in_rows
    assert jit.events[-1]["chosen"] == two_pass[1] and set(jit.events[-1]["timed"]) == set(offered)

    again = aicg.load(path).backward.jit()     # another process: the choice and the outcomes are kept
    assert again.kernel_for("rmsnorm_backward", "bfloat16", 3500, 4096).candidate.id == two_pass[1]
    assert len(timed) == 1 and len(validated) == 4
    again.kernel_for("rmsnorm_backward", "bfloat16", 1 << 16, 4096)   # another shape class is timed at its own
    assert len(timed) == 2 and timed[1][1] == ((1 << 27) // 4096, 4096)   # rows cut to 2^27 elements

    again.kernel_for("softmax_backward", "bfloat16", 3000, 4096)      # one kind: its first two timed
    assert len(timed) == 3 and len(timed[2][0]) == 2 and all(o.startswith("softmax") for o in timed[2][0])


def test_where_this_gpu_times_them_the_candidates_to_time_compile_ahead_together(tmp_path, torch, monkeypatch):
    """Their compiles overlap the first one's validation: the first two of each kind the cache lacks
    are handed to nvrtc.compile_ahead at once, and nothing when the choice is already kept."""
    from aicg.backward import check
    ahead = []
    monkeypatch.setattr(check, "can_time", lambda hardware: True)
    monkeypatch.setattr(check, "validate_on_device", lambda *a, **kw: {"status": "passed"})
    monkeypatch.setattr(check, "time_on_device", lambda kernels, *a: [1e-3 * (i + 1) for i in range(len(kernels))])
    monkeypatch.setattr(nvrtc, "compile_ahead", lambda programs, workers: ahead.append(programs) or len(programs))
    path = make_instance(tmp_path / "instance")
    jit = aicg.load(path).backward.jit()
    chosen = jit.kernel_for("rmsnorm_backward", "bfloat16", 3000, 4096)
    [programs] = ahead
    timed = jit.events[-1]["timed"]
    assert sorted(name.removeprefix("backward/").removesuffix(".cu") for _, name, _, _ in programs) == sorted(timed)
    assert chosen.candidate.id == next(iter(timed)) and len(timed) == 4
    aicg.load(path).backward.jit().kernel_for("rmsnorm_backward", "bfloat16", 3000, 4096)   # kept: nothing ahead
    assert len(ahead) == 1


def test_where_this_gpu_cannot_time_them_the_ladders_first_kind_serves(tmp_path, torch, monkeypatch):
    from aicg.backward import check
    monkeypatch.setattr(check, "validate_on_device", lambda *a, **kw: {"status": "passed"})
    monkeypatch.setattr(check, "time_on_device", lambda *a, **kw: None)
    jit = aicg.load(make_instance(tmp_path / "instance")).backward.jit()
    chosen = jit.kernel_for("layernorm_backward", "bfloat16", 3000, 4096)
    assert chosen.candidate.partials_in_rows and not list((tmp_path / "instance/jit/backward").glob("choice-*"))
