"""inst.matmul and inst.linear on a machine without a GPU (aicg/matrix/dispatch.py): the layout of
each operand read from its strides, every argument check with its message, the kernel chosen per
shape (the workload shape's, else the one estimated fastest of those that take the call, within the
error bound), validated kernels only, the target's architecture, and the PyTorch operators on the
meta device."""
from __future__ import annotations

import json

import pytest

import aicg
from aicg import hw
from aicg.matrix import calls, dispatch, estimate, prior, space
from aicg.matrix.calls import Operand
from aicg.matrix.problem import Problem
from aicg.matrix.space import Epilogue
from doit_project import REPO

BF16 = "bfloat16"


def operand(shape, strides=None, dtype=BF16, ptr=1 << 20, device=0):
    return Operand(None, ptr, tuple(shape), tuple(strides) if strides else calls.dense_strides(shape), dtype,
                   device)


def transposed(rows, cols, **kw):
    """The transpose of a contiguous cols x rows matrix: a rows x cols column-major view."""
    return operand((rows, cols), (1, rows), **kw)


# --- layouts and argument checks ------------------------------------------------------------

def test_linear_reads_f_linear_weights_as_k_major_b():
    call = calls.linear_call(operand((4, 4096)), operand((6144, 4096)), operand((6144,)))
    (p,) = call.problems
    assert (p.m, p.n, p.k, p.a_major, p.b_major, p.lda, p.ldb) == (4, 6144, 4096, "k", "k", 4096, 4096)
    assert p.epilogue == Epilogue(bias=True) and call.out_shape == (4, 6144)


def test_matmul_reads_each_operand_layout_from_its_strides():
    row_b = calls.matmul_call(operand((8, 64)), operand((64, 32)), None, None, None).problems
    assert [(p.a_major, p.b_major, p.ldb) for p in row_b] == [("k", "mn", 32)]
    weight_t = calls.matmul_call(operand((8, 64)), transposed(64, 32), None, None, "silu").problems
    assert [(p.a_major, p.b_major, p.ldb, p.epilogue.activation) for p in weight_t] == [("k", "k", 64, "silu")]
    col_a = calls.matmul_call(transposed(8, 64), operand((64, 32)), None, None, None).problems
    assert [(p.a_major, p.lda) for p in col_a] == [("mn", 8)]
    wide = calls.matmul_call(operand((8, 64), (80, 1)), operand((64, 32), (40, 1)), None, None, None).problems
    assert [(p.lda, p.ldb) for p in wide] == [(80, 40)]


def test_batched_rows_and_a_single_row_are_rows_of_k():
    call = calls.matmul_call(operand((2, 3, 64)), operand((64, 16)), None, operand((2, 3, 16)), "gelu_erf")
    assert call.out_shape == (2, 3, 16) and {(p.m, p.ldr) for p in call.problems} == {(6, 16)}
    single = calls.matmul_call(operand((1, 64)), operand((64, 16)), None, None, None).problems
    assert {(p.m, p.a_major) for p in single} == {(1, "k"), (1, "mn")}   # either reading; the instance's class wins


@pytest.mark.parametrize("make, message", [
    (lambda: calls.matmul_call(operand((8, 64), dtype="float32"), operand((64, 32), dtype="float32"), None, None,
                                  None), "a: expected bfloat16 or float16"),
    (lambda: calls.matmul_call(operand((8, 64)), operand((64, 32), dtype="float16"), None, None, None),
     "b: expected dtype bfloat16"),
    (lambda: calls.matmul_call(operand((8, 64)), operand((64, 32), device=1), None, None, None),
     "b: expected an array on GPU 0"),
    (lambda: calls.matmul_call(operand((8, 64)), operand((65, 32)), None, None, None),
     "b: expected shape (64, N) for a of shape (8, 64), got (65, 32)"),
    (lambda: calls.matmul_call(operand((8, 64)), operand((64, 32), (64, 2)), None, None, None),
     "b: expected a row-major matrix or the transpose of one"),
    (lambda: calls.matmul_call(operand((8, 64)), operand((64, 32)), operand((31,)), None, None),
     "bias: expected a contiguous vector of shape (32,)"),
    (lambda: calls.matmul_call(operand((8, 64)), operand((64, 32)), operand((32,), (2,)), None, None),
     "bias: expected a contiguous vector of shape (32,)"),
    (lambda: calls.matmul_call(operand((8, 64)), operand((64, 32)), None, operand((32, 8)), None),
     "residual: expected the output's shape (8, 32)"),
    (lambda: calls.matmul_call(operand((8, 64)), operand((64, 32)), None, None, "relu"),
     "activation: expected None or one of 'gelu_tanh', 'gelu_erf', 'silu', got 'relu'"),
    (lambda: calls.matmul_call(operand((8, 0)), operand((0, 32)), None, None, None),
     "k = 0: expected at least one term"),
    (lambda: calls.linear_call(operand((8, 64)), operand((32, 65)), None),
     "weight: expected shape (N, 64) for x of shape (8, 64), got (32, 65)"),
    (lambda: calls.linear_call(operand((8, 64), dtype="float64"), operand((32, 64), dtype="float64"), None),
     "x: expected bfloat16 or float16"),
])
def test_a_bad_call_says_what_is_wrong(make, message):
    with pytest.raises(ValueError) as info:
        make()
    assert message in str(info.value)


def test_an_empty_output_computes_nothing():
    call = calls.matmul_call(operand((0, 64)), operand((64, 32)), None, None, None)
    assert call.problems == [] and call.out_shape == (0, 32)


# --- choosing a kernel --------------------------------------------------------------------------

TRIED = {name: tpl.tried for name, tpl in space.templates().items()}
GEMV = space.realisation("gemv", BF16, "k", "k", Epilogue(), **TRIED["gemv"][0])
WGMMA = space.realisation("wgmma", BF16, "k", "k", Epilogue(), **TRIED["wgmma"][0])


MODEL_INPUTS = prior.values(prior.inputs(hw.load_target(REPO / "hwdb", "h100-sxm")))
SHAPES = [[1, 4096, 4096], [4096, 4096, 4096]]


def modelled(real, shape, dtype=BF16):
    return prior.predict_seconds(real, Problem(*shape, dtype), MODEL_INPUTS)


def section(validation="passed"):
    def kernel(real, status, measured):
        cid = f"matmul.{real.name}"
        return cid, {"realisation": real.as_dict(), "cubin": f"kernels/matmul/{cid}.cubin", "cubin_digest": "x",
                     "validation": status, "measured_seconds": measured,
                     "predicted_seconds": [modelled(real, s) for s in SHAPES]}
    gemv_id, gemv = kernel(GEMV, validation, [modelled(GEMV, SHAPES[0]), None])   # the decode kernel takes M <= 16
    wgmma_id, wgmma = kernel(WGMMA, "passed", [modelled(WGMMA, s) for s in SHAPES])
    dispatch_rows = [{"m": 1, "n": 4096, "k": 4096, "candidate": gemv_id, "status": validation},
                     {"m": 4096, "n": 4096, "k": 4096, "candidate": wgmma_id, "status": "passed"}]
    return {"entry": "aicg_matmul", "arch": "sm_90a", "compute_capability": [9, 0], "model_inputs": MODEL_INPUTS,
            "classes": {"matmul.bfloat16.kk.plain": {"dtype": BF16, "a_major": "k", "b_major": "k",
                                                     "epilogue": Epilogue().as_dict(), "shapes": SHAPES,
                                                     "rtol": 1.6e-2, "dispatch": dispatch_rows,
                                                     "kernels": {gemv_id: gemv, wgmma_id: wgmma}}}}, gemv_id, wgmma_id


def chosen_for(kernels, m, n, k, a_ptr=1 << 20):
    call = calls.linear_call(operand((m, k), ptr=a_ptr), operand((n, k)), None)
    cls, problem = kernels._class_for(call)
    kernel, why = cls.choose(problem, {**call.pointers, "c": 1 << 30})
    return (kernel.candidate if kernel else None), why


def test_a_workload_shape_runs_its_kernel_and_another_the_one_estimated_fastest_that_takes_it(tmp_path):
    data, gemv_id, wgmma_id = section()
    kernels = dispatch.MatrixKernels(tmp_path, data, allow_unvalidated=False)
    assert chosen_for(kernels, 1, 4096, 4096)[0] == gemv_id
    assert chosen_for(kernels, 4096, 4096, 4096)[0] == wgmma_id
    assert chosen_for(kernels, 2, 4000, 4096)[0] == gemv_id           # the decode kernel, estimated faster there
    assert chosen_for(kernels, 64, 4096, 4096)[0] == wgmma_id         # M > 16: the decode kernel does not take it
    # the decode kernel measured 30 times slower than modelled: the tiled kernel is estimated faster at M = 2
    data["classes"]["matmul.bfloat16.kk.plain"]["kernels"][gemv_id]["measured_seconds"][0] *= 30
    slow_decode = dispatch.MatrixKernels(tmp_path, data, allow_unvalidated=False)
    assert chosen_for(slow_decode, 1, 4096, 4096)[0] == gemv_id       # a workload shape keeps the build's pick
    assert chosen_for(slow_decode, 2, 4000, 4096)[0] == wgmma_id
    cand, why = chosen_for(kernels, 4, 4096, 4096, a_ptr=(1 << 20) + 2)   # a 2-byte aligned A: neither takes it
    assert cand is None and len(why) == 2 and all("16-byte aligned" in w for w in why)


def test_a_kernel_is_estimated_by_the_model_corrected_by_its_own_times_nearest_first():
    problem = Problem(300, 5000, 4096)
    on_model = [(tuple(s), modelled(WGMMA, s)) for s in SHAPES]
    assert estimate.seconds_at(WGMMA, problem, on_model, MODEL_INPUTS) == pytest.approx(
        prior.predict_seconds(WGMMA, problem, MODEL_INPUTS))
    twice = [(s, 2 * t) for s, t in on_model]
    assert estimate.seconds_at(WGMMA, problem, twice, MODEL_INPUTS) == pytest.approx(
        2 * prior.predict_seconds(WGMMA, problem, MODEL_INPUTS))
    # off by 4x at the decode shape, on the model at 4096: near 4096 the latter speaks
    mixed = [(on_model[0][0], 4 * on_model[0][1]), on_model[1]]
    near_large = estimate.seconds_at(WGMMA, Problem(3000, 4096, 4096), mixed, MODEL_INPUTS)
    assert 1.0 < near_large / modelled(WGMMA, (3000, 4096, 4096)) < 1.01
    assert estimate.seconds_at(WGMMA, problem, [], MODEL_INPUTS) == float("inf")
    kernel = {"measured_seconds": [None, 3e-4], "predicted_seconds": [1e-5, 2e-4]}
    assert estimate.known_seconds(kernel, SHAPES) == [((4096, 4096, 4096), 3e-4)]     # measured before predicted
    assert estimate.known_seconds({"measured_seconds": [None, None], "predicted_seconds": [1e-5, None]},
                                  SHAPES) == [((1, 4096, 4096), 1e-5)]


def test_a_kernel_whose_error_bound_at_the_call_s_k_exceeds_rtol_does_not_take_it(tmp_path):
    fp16 = space.realisation("wgmma", "float16", "k", "k", Epilogue(), **TRIED["wgmma"][0])
    cid = f"matmul.{fp16.name}"
    shapes = [[4096, 4096, 4096]]
    entry = {"dtype": "float16", "a_major": "k", "b_major": "k", "epilogue": Epilogue().as_dict(), "shapes": shapes,
             "rtol": 1e-3, "dispatch": [{"m": 4096, "n": 4096, "k": 4096, "candidate": cid, "status": "passed"}],
             "kernels": {cid: {"realisation": fp16.as_dict(), "cubin": "x", "cubin_digest": "x", "validation": "passed",
                               "measured_seconds": [2e-4], "predicted_seconds": [2e-4]}}}
    data = {"entry": "aicg_matmul", "arch": "sm_90a", "compute_capability": [9, 0], "model_inputs": MODEL_INPUTS,
            "classes": {"matmul.float16.kk.plain": entry}}
    cls = dispatch.MatrixKernels(tmp_path, data, allow_unvalidated=False).classes[
        ("float16", "k", "k", Epilogue())]
    asked = []

    def splits(parts):
        def launch_splits(kernel, problem):
            asked.append((kernel.candidate, problem.k))
            return parts
        return launch_splits
    pointers = {"a": 1 << 20, "b": 1 << 20, "c": 1 << 30}
    assert cls.choose(Problem(64, 4096, 4096, "float16"), pointers, splits(1))[0].candidate == cid and asked == []
    # at K = 40000 the most parts any launch could make would not keep 1e-3; the launch's one part does
    assert cls.choose(Problem(64, 4096, 40000, "float16"), pointers, splits(1))[0].candidate == cid
    assert asked == [(cid, 40000)]
    cand, why = cls.choose(Problem(64, 4096, 40000, "float16"), pointers, splits(2500))
    assert cand is None and "error bound at k = 40000 in 2500 part(s)" in why[0] and "rtol 0.001" in why[0]
    cand, why = cls.choose(Problem(64, 4096, 200000, "float16"), pointers, splits(1))
    assert cand is None and "exceeds the profile's rtol 0.001" in why[0]


def test_a_manifest_from_before_the_estimates_asks_for_a_rebuild(tmp_path):
    data = section()[0]
    del data["classes"]["matmul.bfloat16.kk.plain"]["rtol"]
    with pytest.raises(RuntimeError, match=r"manifest.json: its matrix section has no matmul.bfloat16.kk.plain.rtol "
                                           r"\(an instance built by an earlier aicg\); build it again"):
        dispatch.MatrixKernels(tmp_path, data, allow_unvalidated=False)


def test_unvalidated_kernels_are_refused_unless_asked(tmp_path):
    data, gemv_id, wgmma_id = section(validation="unvalidated")
    strict = dispatch.MatrixKernels(tmp_path, data, allow_unvalidated=False)
    assert chosen_for(strict, 1, 4096, 4096)[0] == wgmma_id and strict.skipped == [f"matmul.bfloat16.kk.plain: {gemv_id}"]
    assert chosen_for(dispatch.MatrixKernels(tmp_path, data, allow_unvalidated=True), 1, 4096, 4096)[0] == gemv_id


def test_a_call_of_a_class_the_instance_lacks_names_what_it_has(tmp_path):
    kernels = dispatch.MatrixKernels(tmp_path, section()[0], allow_unvalidated=False)
    call = calls.matmul_call(operand((8, 64)), operand((64, 32)), None, None, None)   # b row-major: "mn"
    with pytest.raises(ValueError, match=r"no matrix kernels for bfloat16, layouts \(A, B\) kmn, epilogue plain in .*: "
                                         r"it has matmul.bfloat16.kk.plain; add the class"):
        kernels._class_for(call)


def test_kernels_built_for_another_architecture_are_refused_before_loading(tmp_path, monkeypatch):
    class Refused(RuntimeError):
        pass
    kernels = dispatch.MatrixKernels(tmp_path, section()[0], allow_unvalidated=False, error=Refused)
    monkeypatch.setattr(dispatch.driver, "probe_device", lambda ordinal=0: None)
    with pytest.raises(Refused, match=r"built for sm_90a \(compute capability 9.0\) and cannot run on this machine"):
        kernels._check_device(0)


# --- the instance ------------------------------------------------------------------------------

def make_instance(root, validation="passed"):
    data, _, _ = section(validation)
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"instance": "mm-test", "kernels": {}, "matrix": data}))
    return root


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_the_instance_has_matmul_and_linear_with_their_signatures(tmp_path, torch):
    inst = aicg.load(make_instance(tmp_path / "i"))
    assert str(inst.matmul.__signature__) == "(a, b, bias=None, residual=None, activation=None, *, out=None, stream=None)"
    assert str(inst.linear.__signature__) == "(x, weight, bias=None, *, out=None, stream=None)"
    assert "matmul.bfloat16.kk.plain" in inst.linear.__doc__
    with pytest.raises(TypeError, match="x: expected an array in GPU memory, got one on cpu"):
        inst.linear(torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(32, 64, dtype=torch.bfloat16))


def test_an_instance_whose_matrix_kernels_are_unvalidated_says_how_to_use_them(tmp_path, torch):
    data, _, _ = section("unvalidated")
    for k in data["classes"]["matmul.bfloat16.kk.plain"]["kernels"].values():
        k["validation"] = "unvalidated"
    root = tmp_path / "i"
    root.mkdir()
    (root / "manifest.json").write_text(json.dumps({"instance": "mm-test", "kernels": {}, "matrix": data}))
    with pytest.raises(AttributeError, match="not validated on the target; load with allow_unvalidated=True"):
        aicg.load(root).matmul
    assert aicg.load(root, allow_unvalidated=True).matmul


def test_the_pytorch_operators_trace_on_the_meta_device(tmp_path, torch):
    inst = aicg.load(make_instance(tmp_path / "i"))
    ops = getattr(torch.ops, inst.namespace)
    x = torch.empty(2, 3, 64, dtype=torch.bfloat16, device="meta")
    w = torch.empty(32, 64, dtype=torch.bfloat16, device="meta")
    assert ops.linear(x, w).shape == (2, 3, 32)
    assert ops.matmul(x, w.t(), None, None, "gelu_tanh").shape == (2, 3, 32)
    with pytest.raises(ValueError, match=r"weight: expected shape \(N, 64\)"):
        ops.linear(x, w.t())
    with torch.no_grad():
        compiled = torch.compile(lambda x, w: inst.linear(x, w) * 2, fullgraph=True, backend="eager")
        assert compiled(x, w).shape == (2, 3, 32)


def test_a_call_that_needs_a_gradient_is_refused_clearly(tmp_path, torch):
    inst = aicg.load(make_instance(tmp_path / "i"))
    x = torch.empty(4, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    with pytest.raises(RuntimeError, match="no backward kernel or formula in this instance yet"):
        inst.linear(x, torch.empty(32, 64, dtype=torch.bfloat16, device="meta"))


def test_a_call_repeating_an_earlier_ones_signature_launches_its_kernel_on_its_own_arrays(tmp_path, torch,
                                                                                        monkeypatch):
    """A second call with the shapes, strides, dtype, GPU and address alignment of the first runs
    the first one's kernel with nothing chosen again, on its own pointers and a new output; a
    call differing in any of them is worked out anew. (Tensors that say they are on a GPU stand
    in for CUDA tensors: the launch is recorded, not made.)"""
    class OnGpu(torch.Tensor):
        is_cuda = property(lambda self: True)

    launches = []

    class Recorded:
        def launch(self, problem, pointers, stream):
            launches.append((problem.name, pointers))

    data, gemv_id, wgmma_id = section()
    kernels = dispatch.MatrixKernels(tmp_path, data, allow_unvalidated=False)
    loaded = {gemv_id: Recorded(), wgmma_id: Recorded()}
    monkeypatch.setattr(kernels, "_kernel", lambda cls, kernel, device: loaded[kernel.candidate])
    monkeypatch.setattr(dispatch.driver, "probe_device", lambda ordinal=0: type("Info", (), {
        "compute_capability": (9, 0), "name": "stand-in"})())
    monkeypatch.setattr(dispatch.arrays, "current_stream", lambda like: 7)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)
    choices = []
    choose = dispatch.ClassKernels.choose
    monkeypatch.setattr(dispatch.ClassKernels, "choose", lambda self, *a, **k: choices.append(1) or choose(self, *a, **k))

    def tensor(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16).as_subclass(OnGpu)

    x, w = tensor(4096, 4096), tensor(4096, 4096)
    first = kernels.linear(x, w)
    again_x = tensor(4096, 4096)
    second = kernels.linear(again_x, w)
    assert len(choices) == 1 and len(launches) == 2 and launches[0][0] == launches[1][0]
    assert launches[1][1] == {"a": again_x.data_ptr(), "b": w.data_ptr(), "c": second.data_ptr()}
    assert second.shape == first.shape == (4096, 4096) and second.data_ptr() != first.data_ptr()
    kernels.linear(x[:2048], w)                     # another shape: chosen anew
    assert len(choices) == 2
    shifted = tensor(4096 * 4096 + 1)[1:].view(4096, 4096)   # x's shape and strides, 2-byte aligned
    for _ in range(2):   # refused, and nothing kept that would let it through next time
        with pytest.raises(ValueError, match="a and b must be 16-byte aligned"):
            kernels.linear(shifted, w)
    assert len(choices) == 4 and len(launches) == 3


def test_a_repeated_fused_call_launches_with_its_own_bias_and_residual(tmp_path, torch, monkeypatch):
    """The repeat path of a matmul with + bias and + residual passes the second call's vectors, not
    the first's; and a lookup that has met many signatures starts afresh rather than grow."""
    class OnGpu(torch.Tensor):
        is_cuda = property(lambda self: True)

    launches = []

    class Recorded:
        def launch(self, problem, pointers, stream):
            launches.append(pointers)

    epilogue = Epilogue("gelu_tanh", bias=True, residual=True)
    real = space.realisation("wgmma", BF16, "k", "mn", epilogue, **TRIED["wgmma"][0])
    cid, shape = f"matmul.{real.name}", [256, 512, 128]
    data = {"entry": "aicg_matmul", "arch": "sm_90a", "compute_capability": [9, 0], "model_inputs": MODEL_INPUTS,
            "classes": {f"matmul.bfloat16.kmn.{epilogue.name}": {
                "dtype": BF16, "a_major": "k", "b_major": "mn", "epilogue": epilogue.as_dict(), "shapes": [shape],
                "rtol": 1.6e-2, "dispatch": [{"m": 256, "n": 512, "k": 128, "candidate": cid, "status": "passed"}],
                "kernels": {cid: {"realisation": real.as_dict(), "cubin": "x", "cubin_digest": "x",
                                  "validation": "passed", "measured_seconds": [1e-5], "predicted_seconds": [1e-5]}}}}}
    kernels = dispatch.MatrixKernels(tmp_path, data, allow_unvalidated=False)
    monkeypatch.setattr(kernels, "_kernel", lambda cls, kernel, device: Recorded())
    monkeypatch.setattr(dispatch.driver, "probe_device", lambda ordinal=0: type("Info", (), {
        "compute_capability": (9, 0), "name": "stand-in"})())
    monkeypatch.setattr(dispatch.arrays, "current_stream", lambda like: 7)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False)

    def tensor(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16).as_subclass(OnGpu)

    a, b = tensor(256, 128), tensor(128, 512)
    outs = [kernels.matmul(a, b, bias, residual, "gelu_tanh") for bias, residual in
            ((tensor(512), tensor(256, 512)), (tensor(512), tensor(256, 512)))]
    first, second = launches
    assert second["bias"] != first["bias"] and second["residual"] != first["residual"]
    assert second["c"] == outs[1].data_ptr() and second["a"] == a.data_ptr() and second["b"] == b.data_ptr()
    assert len(kernels._repeats) == 1
    kernels._repeats.kept = 1
    wider = tensor(128, 1024)[:, :512]        # another row stride: another signature
    kernels.matmul(a, wider, tensor(512), tensor(256, 512), "gelu_tanh")
    assert len(launches) == 3 and launches[2]["b"] == wider.data_ptr()
    assert len(kernels._repeats) == 1          # full at one: started afresh, holding the newest
    kernels.matmul(a, b, tensor(512), tensor(256, 512), "gelu_tanh")
    assert len(launches) == 4 and len(kernels._repeats) == 1
