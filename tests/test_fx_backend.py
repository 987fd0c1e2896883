"""The FX backend (aicg/fx) on a machine with no GPU: rulesets/patterns.toml and its errors,
the matcher on graphs Dynamo captures on the meta device, what the contract declines and
why, the report, and the rewritten graph computing what the original computed (on the
host, a float64 stand-in in the kernels' place).
"""
from __future__ import annotations

import json
import shutil

import pytest

from aicg.semantics import patterns as patterns_loader
from aicg.semantics import ruleset as ruleset_loader
from doit_project import REPO
from test_torch_ops import Float64Kernels, make_instance

PATTERNS = REPO / "rulesets/patterns.toml"


# --- the patterns file (no PyTorch needed) ---------------------------------------------------

@pytest.fixture(scope="module")
def rule_names():
    return set(ruleset_loader.load(REPO / "rulesets").rules)


def test_the_shipped_patterns_cover_every_operator_larger_ones_first(rule_names):
    loaded = patterns_loader.load(PATTERNS, rule_names)
    from aicg.ops import OPERATORS
    assert {p.operator for p in loaded.patterns} == set(OPERATORS) | {patterns_loader.MATRIX_OPERATOR}
    # every epilogue the matrix kernels have, with and without a bias, is written down once
    epilogues = [patterns_loader.matrix_epilogue(p) for p in loaded.patterns if p.is_matrix]
    assert len(epilogues) == len(set(epilogues)) and {e[0] for e in epilogues} == set(patterns_loader.MATRIX_ACTIVATIONS)
    sizes = [p.size for p in loaded.patterns]
    assert sizes == sorted(sizes, reverse=True)
    written_out = next(p for p in loaded.patterns if p.name == "rmsnorm_written_out")
    assert written_out.size == 8 and written_out.rules == ("fusion",)   # h = convert(x, float32) counted once
    assert loaded.operations["convert"].spellings["Tensor.float"].parameters[1].default == patterns_loader.Dtype("float32")


@pytest.fixture
def patterns_file(tmp_path):
    path = tmp_path / "patterns.toml"
    shutil.copy(PATTERNS, path)
    return path


@pytest.mark.parametrize("old, new, key, expected", [
    ('match = "softmax(x, -1)"', 'match = "sofmax(x, -1)"', "patterns.softmax.match",
     "calls of operations defined in [operations]"),
    ('match = "softmax(x, -1)"', 'match = "softmax(y, -1)"', "patterns.softmax.match",
     "names that are the operator's arguments (x)"),
    ('match = "softmax(x, -1)"', 'match = "softmax(x, -1,"', "patterns.softmax.match", "an expression in Python syntax"),
    ('match = "softmax(x, -1)"', 'match = "softmax(x, -1) + 1"', "patterns.softmax.match",
     "operation calls, names and constants"),
    ('match = "softmax(x, -1)"', 'match = "softmax(x)"', "patterns.softmax.match", "a value (or _) for softmax's dim"),
    ('match = "softmax(x, -1)"', 'match = "softmax(x, axis=-1)"', "patterns.softmax.match",
     "arguments of softmax(input, dim, dtype=...), each once"),
    ('match = "rms_norm(x, _, w, eps)"', 'match = "rms_norm(x, _, w)"', "patterns.rmsnorm.match",
     "binds every argument of rmsnorm (x, w, eps); it does not bind eps"),
    ('match = "layer_norm(x, _, w, b, eps)"', 'match = "x"', "patterns.layernorm.match",
     "an expression whose outermost part is an operation call"),
    ('operator = "softmax"\nmatch = "softmax(x, -1)"', 'operator = "softmaxx"\nmatch = "softmax(x, -1)"',
     "patterns.softmax.operator", "one of"),
    ('rules = ["fusion"]\nwhy = "the graph rounds x + b', 'rules = ["fusions"]\nwhy = "the graph rounds x + b',
     "patterns.bias_gelu_residual.rules", "'fusion'"),
    ('rules = ["fusion"]\nwhy = "the graph rounds x + b and gelu(x + b) to the dtype; the kernel keeps both in float32"',
     'rules = ["fusion"]', "patterns.bias_gelu_residual.why", "a sentence saying why"),
    ('where = { h = "convert(x, float32)" }', 'where = { h = "convert(h, float32)" }',
     "patterns.rmsnorm_written_out.where.h", "expressions that do not use themselves"),
    ('where = { h = "convert(x, float32)" }', 'where = { h = "convert(x, float32)", g = "x" }',
     "patterns.rmsnorm_written_out.where.g", "a name the pattern uses"),
    ('where = { h = "convert(x, float32)" }', 'where = { eps = "convert(x, float32)" }',
     "patterns.rmsnorm_written_out.where.eps", "a name that is not an operation, an operator argument"),
    ('signature = "(input)"\ncallables = ["torch.rsqrt"', 'signature = "(input"\ncallables = ["torch.rsqrt"',
     "operations.rsqrt.signature", "a signature in Python syntax"),
    ('signature = "(input)"\ncallables = ["torch.rsqrt"', 'signature = "(*input)"\ncallables = ["torch.rsqrt"',
     "operations.rsqrt.signature", "named parameters only"),
    ('signature = "(input)"\ncallables = ["torch.rsqrt"', 'signature = "(input=x)"\ncallables = ["torch.rsqrt"',
     "operations.rsqrt.signature", "defaults that are constants or dtype names"),
    ('callables = ["torch.rsqrt", "Tensor.rsqrt"]', 'callables = ["torch.rsqrt", "rsqrt"]',
     "operations.rsqrt.callables", "import paths"),
    ('signatures."torch.square" = "(input, exponent=2)"', 'signatures."torch.cube" = "(input, exponent=3)"',
     'operations.pow.signatures.torch.cube', "one of this operation's callables"),
    ('signatures."torch.square" = "(input, exponent=2)"', 'signatures."torch.square" = "(input)"',
     'operations.pow.signatures.torch.square', "every parameter of pow that has no default (exponent)"),
    ('signature = "(input)"\ncallables = ["torch.rsqrt", "Tensor.rsqrt"]',
     'signature = "(input)"\ncallables = ["torch.rsqrt", "Tensor.rsqrt"]\ncommutative = true',
     "operations.rsqrt.commutative", "false for an operation of fewer than two"),
    ('dims = ["dim"]\n\n[operations.log_softmax]', 'dims = ["axis"]\n\n[operations.log_softmax]',
     "operations.softmax.dims", "'dim'"),
])
def test_a_wrong_patterns_file_is_an_input_error(patterns_file, edit, raises_input_error, rule_names, old, new, key,
                                                  expected):
    edit(patterns_file, old, new)
    with raises_input_error(patterns_file, key, expected):
        patterns_loader.load(patterns_file, rule_names)


# --- lowering captured graphs (PyTorch, meta device) ---------------------------------------

@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def instance(tmp_path_factory, torch):
    import aicg
    return aicg.load(make_instance(tmp_path_factory.mktemp("fx") / "instance"))


def lowered(torch, instance, function, *args, **backend_options):
    """(the report of the one graph Dynamo captures of `function`, its outputs on `args`)."""
    import aicg
    torch._dynamo.reset()
    backend = aicg.backend(instance, inner="eager", **backend_options)
    outputs = torch.compile(function, backend=backend, fullgraph=True)(*args)
    assert len(backend.reports) == 1
    return backend.reports[0], outputs


def meta(torch, *shape, dtype=None):
    return torch.empty(*shape, device="meta", dtype=dtype or torch.bfloat16)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_model_blocks_get_their_norms_and_softmax_replaced(torch, instance, bench_module, name):
    bench = bench_module("model_bench")
    block, x = bench.make_block(name, "meta"), bench.block_input(name, 2, 64, "meta")
    report, y = lowered(torch, instance, block, x)
    assert tuple(y.shape) == tuple(x.shape) and y.dtype == torch.bfloat16
    assert report.counts() == bench.EXPECTED_REPLACEMENTS[name]
    if name == "llama":   # the residual + RMSNorm chain matched, but its sum is the residual stream
        declined = [(d.pattern, d.kind) for d in report.declined]
        assert declined == [("residual_rmsnorm_written_out", "users")]
        assert {r.pattern for r in report.replaced} == {"rmsnorm_written_out"}
        assert report.left["scaled_dot_product_attention"] == 1 and report.left["linear"] == 7
    else:
        assert report.declined == [] and report.left["gelu"] == 1


def test_every_spelling_of_softmax_is_one_operation(torch, instance):
    nn, F = torch.nn, torch.nn.functional
    softmax_module = nn.Softmax(dim=-1)

    def f(x):
        return F.softmax(x, dim=-1), x.softmax(-1), torch.softmax(x, 2), softmax_module(x), torch.special.softmax(x, -1)

    report, outputs = lowered(torch, instance, f, meta(torch, 2, 3, 40))
    assert report.counts() == {"softmax": 5} and report.left == {}
    assert all(tuple(o.shape) == (2, 3, 40) for o in outputs)


@pytest.mark.parametrize("build, kind, reason", [
    (lambda torch, x: torch.softmax(x, 1), "structure", "node softmax (softmax), dim: (-2,), the pattern needs (-1,)"),
    (lambda torch, x: torch.softmax(x.double(), -1), "dtype", "x is float64; this instance has softmax in bfloat16, float32"),
    (lambda torch, x: torch.softmax(x.half(), -1), "dtype", "x is float16"),
    (lambda torch, x: torch.softmax(x.transpose(1, 2), -1), "layout", "x: expected contiguous rows (last stride 1)"),
    (lambda torch, x: torch.softmax(x, -1, dtype=torch.float32), "structure",
     "node softmax (softmax), dtype: float32, the pattern needs None"),
    (lambda torch, x: torch.nn.functional.layer_norm(x, x.shape[-2:], torch.ones_like(x[0]), torch.zeros_like(x[0])),
     "shape",
     "w has shape [3, 40]; the kernel takes [40]"),
    (lambda torch, x: torch.nn.functional.layer_norm(x, x.shape[-1:]), "shape", "w: the kernel takes a tensor, the graph passes None"),
    (lambda torch, x: torch.rms_norm(x, x.shape[-1:], torch.ones_like(x[0, 0])), "scalar",
     "eps: the kernel takes a number, the graph passes None"),
])
def test_what_the_kernel_does_not_take_is_declined_with_its_reason(torch, instance, build, kind, reason):
    report, _ = lowered(torch, instance, lambda x: build(torch, x), meta(torch, 2, 3, 40))
    assert report.replaced == []
    assert [(d.kind, reason in d.reason) for d in report.declined] == [(kind, True)], report.text()


def test_a_result_in_another_dtype_is_declined_and_the_float32_softmax_inside_replaced(torch, instance):
    report, y = lowered(torch, instance, lambda x: torch.softmax(x.float(), -1).half(), meta(torch, 2, 40))
    assert [(d.pattern, d.kind, d.reason) for d in report.declined] == [
        ("softmax_in_float32", "dtype", "the graph's result is float16; the kernel returns x's bfloat16")]
    assert [(r.pattern, r.dtype) for r in report.replaced] == [("softmax", "float32")]
    assert y.dtype == torch.float16


def test_a_host_graph_is_declined_for_its_device(torch, instance):
    report, _ = lowered(torch, instance, lambda x: torch.softmax(x, -1), torch.randn(4, 8, dtype=torch.bfloat16))
    assert [(d.kind, d.reason) for d in report.declined] == [("device", "x is on cpu; the kernels run on CUDA devices")]


def test_rows_lying_apart_are_taken_as_they_lie(torch, instance):
    report, y = lowered(torch, instance, lambda x: torch.softmax(x[:, :40], -1), meta(torch, 6, 64))
    assert report.counts() == {"softmax": 1} and tuple(y.shape) == (6, 40)


def test_an_intermediate_used_elsewhere_keeps_the_chain_whole(torch, instance):
    F = torch.nn.functional

    def f(x, r, b):
        g = F.gelu(x + b)
        return g + r, g * 2

    report, _ = lowered(torch, instance, f, meta(torch, 4, 32), meta(torch, 4, 32), meta(torch, 32))
    assert report.replaced == []
    assert [(d.pattern, d.kind) for d in report.declined] == [("bias_gelu_residual", "users")]
    assert "node g (gelu) is used by mul as well" in report.declined[0].reason


def test_fused_chains_match_in_either_order_of_a_sum(torch, instance):
    F = torch.nn.functional

    def f(x, r, b, w):
        return F.gelu(x + b) + r, r + F.gelu(b + x), F.rms_norm(x + r, (32,), w, 1e-6)

    args = (meta(torch, 4, 32), meta(torch, 4, 32), meta(torch, 32), meta(torch, 32))
    report, _ = lowered(torch, instance, f, *args)
    assert report.counts() == {"bias_gelu_residual": 2, "residual_rmsnorm": 1}, report.text()


def test_a_reduction_that_keeps_its_dimension_gets_it_back(torch, instance):
    report, (total, top) = lowered(torch, instance, lambda x: (x.sum(-1, keepdim=True), x.amax(-1)),
                                   meta(torch, 5, 7, 33))
    assert report.counts() == {"row_sum": 1, "row_max": 1} and report.left == {}
    assert tuple(total.shape) == (5, 7, 1) and tuple(top.shape) == (5, 7)


def test_dynamic_shapes_are_compared_by_their_symbols(torch, instance):
    F = torch.nn.functional

    def f(x, r, w):
        return F.rms_norm(x + r, (x.shape[-1],), w, 1e-6), x.amax(-1, keepdim=True)

    import aicg
    torch._dynamo.reset()
    backend = aicg.backend(instance, inner="eager")
    normed, top = torch.compile(f, backend=backend, dynamic=True)(meta(torch, 6, 32), meta(torch, 6, 32),
                                                                 meta(torch, 32))
    assert backend.counts() == {"residual_rmsnorm": 1, "row_max": 1}, backend.report()
    assert all(not isinstance(size, int) for size in backend.reports[0].replaced[0].shape)   # symbols, e.g. 's77'
    assert tuple(normed.shape) == (6, 32) and tuple(top.shape) == (6, 1)


def test_a_rule_illegal_at_the_preservation_level_declines_the_pattern(torch, tmp_path, bench_module):
    import aicg
    bitwise = aicg.load(make_instance(tmp_path / "bitwise", preservation="bitwise"))
    bench = bench_module("model_bench")
    report, _ = lowered(torch, bitwise, bench.make_block("llama", "meta"), bench.block_input("llama", 1, 8, "meta"))
    assert report.replaced == []
    legality = [d for d in report.declined if d.kind == "legality"]
    assert [d.pattern for d in legality] == ["rmsnorm_written_out", "rmsnorm_written_out"]
    assert ("fusion is not legal for rmsnorm in bfloat16 at preservation 'bitwise' (the graph rounds x * "
            "rsqrt(mean + eps) to the dtype before the weight multiplies it; the kernel keeps it in float32): "
            "fusion needs order in ('fixed', 'any'); the profile has 'reference'") == legality[0].reason
    # rms_norm itself rounds once, as the kernel does: no rule beyond the operator's own
    report, _ = lowered(torch, bitwise, lambda x, w: torch.rms_norm(x, (16,), w, 1e-6), meta(torch, 4, 16),
                        meta(torch, 16))
    assert report.counts() == {"rmsnorm": 1}


def test_an_operator_the_instance_lacks_is_named(torch, tmp_path):
    import aicg
    norms_only = aicg.load(make_instance(tmp_path / "norms", ops=("rmsnorm",), dtypes=("bfloat16",)))
    report, _ = lowered(torch, norms_only, lambda x: torch.softmax(x, -1), meta(torch, 4, 16))
    assert [(d.kind, d.reason) for d in report.declined] == [
        ("operator", "this instance has no softmax kernels (it has: rmsnorm)")]


def test_the_rewritten_graph_computes_what_the_original_computed(torch, tmp_path, monkeypatch):
    """On the host, the float64 stand-in in every kernel's place (and the contract told the
    host is a device): each replacement passes the right values in the right places (x and b
    of a commuted sum, eps, a kept dimension)."""
    import aicg
    from aicg.fx import contract
    monkeypatch.setattr(contract, "DEVICES", (*contract.DEVICES, "cpu"))
    inst = aicg.load(make_instance(tmp_path / "instance", dtypes=("float32",)))
    for name, kernels in inst.ops.items():
        inst.ops[name] = Float64Kernels(name, kernels.entries)
    F = torch.nn.functional

    def f(x, r, w, b):
        h = x.float()
        normed = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)
        return (F.softmax(x, -1), F.log_softmax(x, dim=-1), F.layer_norm(x, (48,), w, b, 1e-3),
                torch.rms_norm(x, (48,), w, 1e-4), normed, x.sum(-1, keepdim=True), x.amax(-1),
                r + F.gelu(b + x), F.rms_norm(r + x, [48], w, 1e-6),
                torch.softmax(F.gelu(x + b) + r, -1).sum(-1))   # a chain of replacements, one feeding the next

    generator = torch.Generator().manual_seed(3)
    x, r = torch.randn(3, 5, 48, generator=generator), torch.randn(3, 5, 48, generator=generator)
    w, b = torch.rand(48, generator=generator) + 0.5, torch.randn(48, generator=generator)
    report, found = lowered(torch, inst, f, x, r, w, b)
    assert report.counts() == {"softmax": 2, "log_softmax": 1, "layernorm": 1, "rmsnorm": 2, "row_sum": 2,
                               "row_max": 1, "bias_gelu_residual": 2, "residual_rmsnorm": 1}, report.text()
    assert sum(k.calls for k in inst.ops.values()) == 12   # one call a replacement
    for got, wanted in zip(found, f(x, r, w, b)):
        assert got.shape == wanted.shape and torch.allclose(got, wanted, rtol=1e-5, atol=1e-5)


def test_the_report_says_it_in_words_and_as_data(torch, instance, bench_module):
    import aicg
    bench = bench_module("model_bench")
    torch._dynamo.reset()
    backend = aicg.backend(instance, inner="eager")
    block = torch.compile(bench.make_block("llama", "meta"), backend=backend)
    block(bench.block_input("llama", 1, 8, "meta"))
    text = backend.report()
    assert text.startswith("graph 0: aicg backend: 2 replaced (rmsnorm 2), 1 declined,")
    assert "declined h_5: residual_rmsnorm_written_out -> residual_rmsnorm [users]" in text
    record = json.loads(json.dumps(backend.reports[0].as_record()))
    assert record["counts"] == {"rmsnorm": 2} and len(record["replaced"]) == 2
    assert record["replaced"][0]["nodes"][-1] == record["replaced"][0]["node"]
    assert backend.counts() == {"rmsnorm": 2}


def test_backend_arguments_are_checked_when_it_is_made(torch, instance, tmp_path, edit, raises_input_error):
    import aicg
    with pytest.raises(ValueError, match="mode: expected one of .*'max-autotune'.*, got 'fastest'"):
        aicg.backend(instance, mode="fastest")
    patterns_file = tmp_path / "patterns.toml"
    shutil.copy(PATTERNS, patterns_file)
    edit(patterns_file, '"torch.rsqrt", "Tensor.rsqrt"', '"torch.rsqrtt", "Tensor.rsqrt"')
    with raises_input_error(patterns_file, "operations.rsqrt.callables", "callables this PyTorch"):
        aicg.backend(instance, patterns=patterns_file)
    bare = make_instance(tmp_path / "bare")
    shutil.rmtree(bare / "source")
    with pytest.raises(FileNotFoundError, match="no planning snapshot"):
        aicg.backend(aicg.load(bare))


# --- matrix multiplies: F.linear and its epilogue onto inst.matmul ---------------------------

def with_matrix(root, classes, dtype="bfloat16"):
    """`root`'s instance with a matrix section: one validated wgmma kernel for each epilogue in
    `classes` (Epilogue objects), F.linear's layouts."""
    from aicg import hw
    from aicg.matrix import prior, space
    manifest = json.loads((root / "manifest.json").read_text())
    section = {}
    for epilogue in classes:
        real = space.realisation("wgmma", dtype, "k", "k", epilogue, **space.templates()["wgmma"].tried[0])
        name = f"matmul.{dtype}.kk.{epilogue.name}"
        section[name] = {"dtype": dtype, "a_major": "k", "b_major": "k", "epilogue": epilogue.as_dict(),
                         "shapes": [[128, 256, 64]], "rtol": 1.6e-2,
                         "kernels": {f"matmul.{real.name}": {"realisation": real.as_dict(), "validation": "passed",
                                                             "measured_seconds": [1e-5]}},
                         "dispatch": [{"m": 128, "n": 256, "k": 64, "candidate": f"matmul.{real.name}"}]}
    model_inputs = prior.values(prior.inputs(hw.load_target(REPO / "hwdb", "h100-sxm")))
    manifest["matrix"] = {"arch": "sm_90a", "compute_capability": [9, 0], "classes": section,
                          "model_inputs": model_inputs}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def epilogues(*names):
    from aicg.matrix.space import Epilogue
    parts = {"plain": {}, "bias": {"bias": True}, "residual": {"residual": True},
             "bias+residual": {"bias": True, "residual": True}, "silu": {"activation": "silu"},
             "bias+gelu_erf": {"bias": True, "activation": "gelu_erf"},
             "bias+gelu_erf+residual": {"bias": True, "activation": "gelu_erf", "residual": True}}
    return [Epilogue(**parts[n]) for n in names]


@pytest.mark.parametrize("name, classes, expected", [
    ("llama", ("plain", "silu", "residual"),
     {"linear": 3 + 1, "linear_residual": 2, "linear_silu": 1}),          # q, k, v, up; o and down; gate
    ("gpt2", ("bias", "bias+residual", "bias+gelu_erf"),
     {"linear_bias": 1, "linear_bias_residual": 2, "linear_bias_gelu": 1}),
])
def test_the_model_blocks_get_their_projections_and_epilogues_onto_the_matrix_kernels(
        torch, tmp_path, bench_module, name, classes, expected):
    import aicg
    inst = aicg.load(with_matrix(make_instance(tmp_path / "i", dtypes=("bfloat16",)), epilogues(*classes)))
    bench = bench_module("model_bench")
    report, y = lowered(torch, inst, bench.make_block(name, "meta"), bench.block_input(name, 2, 64, "meta"))
    assert tuple(y.shape) == (2, 64, bench.BLOCKS[name][1]().hidden)
    by_pattern = {}
    for r in report.replaced:
        if r.operator == "matmul":
            by_pattern[r.pattern] = by_pattern.get(r.pattern, 0) + 1
    assert by_pattern == expected, report.text()
    assert "linear" not in report.left
    assert report.counts()["matmul"] == sum(expected.values()) == bench.EXPECTED_MATMUL[name]
    assert not [d for d in report.declined if d.operator == "matmul"]
    # the model bench's instance has these classes, and the block's projections are at its shapes
    from aicg.matrix.space import Epilogue
    wanted = {e.name for e in epilogues(*classes)}
    planned = {Epilogue(**e).name for e, _ in bench.matmul_classes(128)}
    assert wanted <= planned
    hidden = bench.BLOCKS[name][1]().hidden
    assert all(any(n == hidden or k == hidden for _, n, k in shapes) for e, shapes in bench.matmul_classes(128)
               if Epilogue(**e).name in wanted)


def test_an_epilogue_the_instance_has_no_class_for_is_declined_naming_what_it_has(torch, tmp_path, bench_module):
    import aicg
    inst = aicg.load(with_matrix(make_instance(tmp_path / "i", dtypes=("bfloat16",)), epilogues("plain")))
    bench = bench_module("model_bench")
    report, _ = lowered(torch, inst, bench.make_block("gpt2", "meta"), bench.block_input("gpt2", 1, 8, "meta"))
    declined = [d for d in report.declined if d.operator == "matmul"]
    assert declined and {d.kind for d in declined} == {"operator"}
    assert any(d.reason.startswith("this instance has no matrix kernels for bfloat16, layouts (A, B) kk, epilogue "
                                   "bias+residual (it has matmul.bfloat16.kk.plain)") for d in declined)
    assert report.left["linear"] == 4


def test_a_weight_in_another_dtype_or_a_host_graph_is_declined(torch, tmp_path):
    import aicg
    F = torch.nn.functional
    inst = aicg.load(with_matrix(make_instance(tmp_path / "i", dtypes=("bfloat16",)), epilogues("plain")))
    report, _ = lowered(torch, inst, lambda x, w: F.linear(x, w), meta(torch, 4, 64), meta(torch, 32, 64,
                                                                                          dtype=torch.float32))
    assert [(d.pattern, d.kind) for d in report.declined] == [("linear", "dtype")]
    report, _ = lowered(torch, inst, lambda x, w: F.linear(x, w), torch.ones(4, 64, dtype=torch.bfloat16),
                        torch.ones(32, 64, dtype=torch.bfloat16))
    assert [(d.pattern, d.kind) for d in report.declined] == [("linear", "device")]


def test_the_rewritten_matrix_graph_computes_what_the_original_computed(torch, tmp_path, monkeypatch):
    """On the host, a float64 stand-in for the matrix kernels: each replacement passes x, the weight
    (as its transpose), the bias, the residual and the activation where the kernel takes them."""
    import aicg
    from aicg.fx import contract
    monkeypatch.setattr(contract, "DEVICES", (*contract.DEVICES, "cpu"))
    inst = aicg.load(with_matrix(make_instance(tmp_path / "i", dtypes=("bfloat16",)),
                                 epilogues("plain", "bias", "bias+gelu_erf+residual", "silu"), dtype="bfloat16"))
    F = torch.nn.functional
    acts = {"none": lambda t: t, "gelu_erf": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
            "silu": F.silu}
    calls = []

    def matmul(a, b, bias=None, residual=None, activation=None):
        calls.append(activation)
        y = a.double() @ b.double() + (bias.double() if bias is not None else 0)
        y = acts[activation or "none"](y) + (residual.double() if residual is not None else 0)
        return y.to(a.dtype)
    monkeypatch.setattr(inst.matrix, "matmul", matmul)

    def f(x, w, b, r, w2):
        return (F.linear(x, w), F.linear(x, w, b), r + F.gelu(F.linear(x, w, b)), F.silu(F.linear(x, w2)))

    g = torch.Generator().manual_seed(5)
    x, w, w2 = (torch.randn(*s, generator=g).bfloat16() for s in ((3, 5, 64), (32, 64), (16, 64)))
    b, r = torch.randn(32, generator=g).bfloat16(), torch.randn(3, 5, 32, generator=g).bfloat16()
    report, found = lowered(torch, inst, f, x, w, b, r, w2)
    assert report.counts() == {"matmul": 4}, report.text()
    assert sorted(calls, key=str) == sorted([None, None, "gelu_erf", "silu"], key=str)
    for got, wanted in zip(found, f(x, w, b, r, w2)):
        assert got.shape == wanted.shape and torch.allclose(got.float(), wanted.float(), rtol=2e-2, atol=2e-2)


def test_every_model_bench_variant_names_a_compiler_and_a_mode_inductor_knows(torch, tmp_path, bench_module):
    import aicg
    inst = aicg.load(make_instance(tmp_path / "i", dtypes=("bfloat16",)))
    bench = bench_module("model_bench")
    block = bench.make_block("gpt2", "meta")
    for variant in (*bench.VARIANTS, *bench.MORE_VARIANTS):
        run, backend = bench.compiled(variant, block, inst)
        mode = variant.partition("-")[2] or None
        assert (backend is None) == (not variant.startswith("aicg")), variant
        if backend is not None:
            assert backend.mode == mode
        assert mode is None or mode in torch._inductor.list_mode_options()
