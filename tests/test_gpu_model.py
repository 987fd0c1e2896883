"""GPU test: a model through an instance. The Llama-style and GPT-2-style blocks of
tests/bench/model_bench.py in bfloat16 through aicg.backend, against a float64 eager run;
torch.compile(fullgraph=True) over a function calling instance operators; a CUDA graph of
it replaying; the eager paths (direct launch, dispatcher) agreeing; a gradient through an
instance operator.

Built for this machine's GPU (`target=auto`): every operator in bfloat16 at the blocks'
row shapes (and the chain's). Skipped without a GPU that hwdb/ has an entry for; run on the device with
`pytest -m gpu tests/test_gpu_model.py`.
"""
from __future__ import annotations

import pytest

from doit_project import doit, instance_dir, make_project

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("device_target")]

BATCH, SEQ = 2, 64
ROWS = BATCH * SEQ
PROFILE = f"""[instance]
name = "small"
target = "nvidia-h200"
preservation = "tolerance"

[plan]
candidates_per_family = 2

[validation]
timing_repetitions = 3

[[workload]]
ops = ["rmsnorm", "residual_rmsnorm", "row_sum", "row_max"]
dtypes = ["bfloat16"]
shapes = [[{ROWS}, 4096]]

[[workload]]
ops = ["layernorm", "bias_gelu_residual"]
dtypes = ["bfloat16"]
shapes = [[{ROWS}, 768], [{ROWS}, 4096]]

[[workload]]
ops = ["softmax", "log_softmax"]
dtypes = ["bfloat16"]
shapes = [[{BATCH * 12 * SEQ}, {SEQ}]]
"""


@pytest.fixture(scope="module")
def instance(tmp_path_factory, device_target, bench_module):
    import aicg
    project = make_project(tmp_path_factory.mktemp("gpu_model"),
                           PROFILE + bench_module("model_bench").matmul_entries(ROWS))
    run = doit(project, "build", "profile=rulesets/profiles/small.toml", "target=auto")
    assert run.code == 0, run.output
    return aicg.load(instance_dir(project, device_target.target))


@pytest.fixture(scope="module")
def bench(bench_module):
    return bench_module("model_bench")


def bfloat16_rtol(instance) -> float:
    return instance.manifest["preservation"]["tolerance"]["bfloat16"]["rtol"]


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_block_through_the_backend_is_within_the_instances_tolerance_of_float64(instance, bench, name):
    import aicg
    torch._dynamo.reset()
    block, x = bench.make_block(name, "cuda"), bench.block_input(name, BATCH, SEQ, "cuda")
    reference = bench.reference_output(name, x, block)
    backend = aicg.backend(instance)
    with torch.no_grad():
        found, eager = torch.compile(block, backend=backend)(x), block(x)
    expected = {**bench.EXPECTED_REPLACEMENTS[name], "matmul": bench.EXPECTED_MATMUL[name]}
    assert backend.counts() == expected, backend.report()
    for op in bench.EXPECTED_REPLACEMENTS[name]:   # the instance's own kernels ran there
        assert instance.ops[op].chosen, f"no {op} kernel ran"
    assert instance.matmul.chosen, "no matrix kernel ran"
    error, eager_error = bench.relative_error(found, reference), bench.relative_error(eager, reference)
    assert error <= bfloat16_rtol(instance), (error, eager_error)
    assert error <= 2 * eager_error, f"{error:.3g} against PyTorch's own bfloat16 {eager_error:.3g}"


def _chain(instance):
    def chain(x, r, b, w, wide):
        h = instance.bias_gelu_residual(x, r, b)
        normed = instance.residual_rmsnorm(h, r, w, eps=1e-5)
        return normed, instance.row_sum(normed), instance.softmax(wide), instance.log_softmax(wide)
    return chain


def _chain_inputs(seed: int):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.bfloat16
    x, r = (torch.randn(ROWS, 4096, device="cuda", generator=generator).to(t) for _ in range(2))
    b = torch.randn(4096, device="cuda", generator=generator).to(t)
    w = (torch.rand(4096, device="cuda", generator=generator) + 0.5).to(t)
    wide = torch.randn(BATCH * 12 * SEQ, SEQ, device="cuda", generator=generator).to(t)
    return x, r, b, w, wide


def test_fullgraph_compiles_instance_operators_and_a_cuda_graph_replays_them(instance):
    chain = _chain(instance)
    args = _chain_inputs(0)
    with torch.no_grad():
        expected = chain(*args)   # eager: also the warm-up that plans each shape's kernel
        explained = torch._dynamo.explain(chain)(*args)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        torch._dynamo.reset()
        compiled = torch.compile(chain, fullgraph=True)
        for got, want in zip(compiled(*args), expected):
            assert torch.equal(got, want)   # the same kernels on the same inputs: the same bits

        static = [a.clone() for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            chain(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = chain(*static)
        fresh = _chain_inputs(1)
        for target, value in zip(static, fresh):
            target.copy_(value)
        graph.replay()
        for got, want in zip(captured, chain(*fresh)):
            assert torch.equal(got, want)

        torch._dynamo.reset()
        reduce_overhead = torch.compile(chain, fullgraph=True, mode="reduce-overhead")   # Inductor's CUDA graphs
        for _ in range(3):
            found = reduce_overhead(*fresh)
        for got, want in zip(found, chain(*fresh)):
            assert torch.equal(got, want)


def test_direct_launches_and_the_dispatcher_give_the_same_bits(instance):
    x, r, b, w, wide = _chain_inputs(2)
    ops = getattr(torch.ops, instance.namespace)
    with torch.no_grad():
        assert torch.equal(instance.rmsnorm(x, w), ops.rmsnorm(x, w))
        out = torch.empty_like(wide)
        assert instance.softmax(wide, out=out) is out and torch.equal(out, ops.softmax(wide))
        sliced = torch.randn(ROWS, 4200, device="cuda").to(torch.bfloat16)[:, :4096]   # rows lying apart
        assert torch.equal(instance.rmsnorm(sliced, w), ops.rmsnorm(sliced.contiguous(), w))


def test_a_gradient_through_an_instance_operator_matches_float64(instance):
    x, _, _, w, _ = _chain_inputs(3)
    x, w = x.requires_grad_(), w.requires_grad_()
    instance.rmsnorm(x, w, eps=1e-5).float().square().sum().backward()
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-5) * wd).square().sum().backward()
    for got, want in ((x.grad, xd.grad), (w.grad, wd.grad)):
        assert float((got.double() - want).norm() / want.norm()) <= bfloat16_rtol(instance)
