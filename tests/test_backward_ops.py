"""The backward operators' float64 references (aicg/backward/ops.py) against PyTorch's autograd in
float64, and their error scales against the kernels' arithmetic emulated in float32: the order
the templates sum in (each lane in order, then a pairwise tree; the column sums in chunks of row
lanes) keeps every output within the bound validation holds the device to. CPU only."""
from __future__ import annotations

import math

import numpy as np
import pytest

from aicg import codegen
from aicg.backward import check, space
from aicg.backward.ops import BACKWARD_OPS, BY_FORWARD, draw, reference
from aicg.dtypes import DTYPES

TOLERANCE = {"float32": (1e-5, 1e-7), "bfloat16": (1.6e-2, 1e-5), "float16": (1e-3, 1e-5)}   # the presets'
SHAPES = [(3, 1), (5, 7), (37, 100), (9, 515), (64, 2048), (130, 33)]


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _autograd(torch, op, inputs: dict) -> dict:
    """PyTorch's float64 gradients of the same rounded inputs."""
    t = {n: torch.from_numpy(v) for n, v in inputs.items()}
    g = t["g"]
    if op.forward == "softmax":
        return {"dx": torch._softmax_backward_data(g, t["y"], -1, torch.float64).numpy()}
    if op.forward == "log_softmax":
        return {"dx": torch._log_softmax_backward_data(g, t["y"], -1, torch.float64).numpy()}
    x, w = t["x"].requires_grad_(), t["w"].requires_grad_()
    cols = x.shape[-1]
    if op.forward == "rmsnorm":
        y = torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-5)
        dx, dw = torch.autograd.grad(y, (x, w), g)
        return {"dx": dx.numpy(), "dw": dw.numpy()}
    b = torch.zeros(cols, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.layer_norm(x, (cols,), w, b, eps=1e-5)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), g)
    return {"dx": dx.numpy(), "dw": dw.numpy(), "db": db.numpy()}


@pytest.mark.parametrize("name", BACKWARD_OPS)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_references_are_pytorchs_gradients(torch, name, shape):
    op, dtype = BACKWARD_OPS[name], DTYPES["float32"]
    inputs = draw(op, dtype, *shape, trial=1, rng=np.random.default_rng(3))
    wide = {n: dtype.decode(a).astype(np.float64).reshape(a.shape) for n, a in inputs.items()}
    expected = _autograd(torch, op, wide)
    found = reference(op, dtype, inputs)
    assert set(found) == set(op.outputs) == set(expected)
    for output, (gradient, scale) in found.items():
        assert gradient.shape == expected[output].shape == scale.shape
        assert np.allclose(gradient, expected[output], rtol=1e-12, atol=1e-12), output
        assert np.all(scale >= np.abs(gradient) * (1 - 1e-12)), f"{output}: a scale below the gradient's magnitude"


def test_a_saved_output_is_the_forwards_own(torch):
    for name in ("softmax_backward", "log_softmax_backward"):
        y = DTYPES["bfloat16"].decode(draw(BACKWARD_OPS[name], DTYPES["bfloat16"], 6, 50, 0, np.random.default_rng(1))["y"])
        probabilities = y.reshape(6, 50) if name == "softmax_backward" else np.exp(y.reshape(6, 50))
        assert np.allclose(probabilities.sum(axis=1), 1.0, rtol=2e-2)
    assert BY_FORWARD["layernorm"].column_outputs == ("dw", "db") and BY_FORWARD["softmax"].stats_per_row == 0


# --- the kernels' order, emulated in float32 ---------------------------------------------------

def _row_sums(values: np.ndarray, lanes: int, vec: int) -> np.ndarray:
    """Row sums in the templates' order: lane l adds packs l, l + lanes, ... element by element,
    then the lanes' sums meet pairwise."""
    rows, cols = values.shape
    packs = -(-cols // vec)
    padded = np.zeros((rows, packs * vec), np.float32)
    padded[:, :cols] = values
    per_lane = np.zeros((rows, lanes), np.float32)
    for p in range(packs):
        for k in range(vec):
            per_lane[:, p % lanes] += padded[:, p * vec + k]
    width = 1 << (lanes - 1).bit_length()
    tree = np.zeros((rows, width), np.float32)
    tree[:, :lanes] = per_lane
    while tree.shape[1] > 1:
        half = tree.shape[1] // 2
        tree = tree[:, :half] + tree[:, half:]
    return tree[:, 0]


def _column_sums(values: np.ndarray, chunk: int, row_lanes: int) -> np.ndarray:
    """Column sums in the two passes' order: per chunk, row lanes in order, then lane after lane."""
    def lanes_then_fold(block: np.ndarray) -> np.ndarray:
        sums = [np.add.accumulate(block[lane::row_lanes], axis=0, dtype=np.float32)[-1]
                if len(block[lane::row_lanes]) else np.zeros(block.shape[1], np.float32) for lane in range(row_lanes)]
        total = sums[0]
        for s in sums[1:]:
            total = (total + s).astype(np.float32)
        return total
    partials = np.stack([lanes_then_fold(values[c:c + chunk]) for c in range(0, len(values), chunk)])
    return lanes_then_fold(partials)


def _emulate(name: str, dtype, inputs: dict, rows_params: dict, columns_params: dict | None) -> dict:
    f = {n: dtype.decode(a).reshape(a.shape) for n, a in inputs.items()}
    g, cols = f["g"], f["g"].shape[1]
    lanes = codegen.lanes_per_row(rows_params["topology"], rows_params["threads"])
    vec = rows_params["vec_bytes"] // dtype.size
    total = lambda v: _row_sums(v.astype(np.float32), lanes, vec)[:, None]
    n = np.float32(cols)
    if name == "softmax_backward":
        y = f["y"]
        return {"dx": y * (g - total(g * y))}
    if name == "log_softmax_backward":
        return {"dx": g - np.exp(f["y"]) * total(g)}
    x, w, eps = f["x"], f["w"], np.float32(1e-5)
    if name == "rmsnorm_backward":
        inv = (np.float32(1) / np.sqrt(total(x * x) / n + eps)).astype(np.float32)
        c = inv * inv * inv * (total(g * w * x) / n)
        contributions = {"dw": g * x * inv}
        dx = inv * (g * w) - x * c
    else:
        mean = total(x) / n
        a = total(g * w) / n
        centred = x - mean
        inv = (np.float32(1) / np.sqrt(total(centred * centred) / n + eps)).astype(np.float32)
        c = inv * inv * inv * (total(g * w * centred) / n)
        dx = inv * (g * w - a) - centred * c
        contributions = {"dw": g * centred * inv, "db": g}
    rows = len(x)
    family = space.shipped().families["column_sum_two_pass"]
    chunk, _ = space.chunking(family, columns_params, rows)
    row_lanes = columns_params["threads"] // columns_params["col_lanes"]
    return {"dx": dx, **{k: _column_sums(v.astype(np.float32), chunk, row_lanes) for k, v in contributions.items()}}


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_the_kernels_order_in_float32_stays_within_the_bound(name, dtype_name):
    """The first candidate each shape would take, its sums emulated (no FMA: one rounding more than
    the device), on the awkward shapes' kind of rows and on rows past 2048: every output within
    atol + rtol * scale on two trials of each distribution."""
    shipped = space.shipped()
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(11)
    rows_family = shipped.families[f"{name}_rows"]
    columns_ladder = shipped.families["column_sum_two_pass"].ladder
    for rows, cols in SHAPES + [(3001, 33), (5, 4097)]:
        rung = next(r for r in rows_family.ladder if r.serves(cols))
        columns = next(r for r in columns_ladder if r.serves(cols)).params
        for trial in range(4):
            inputs = draw(BACKWARD_OPS[name], dtype, rows, cols, trial, rng)
            found = _emulate(name, dtype, inputs, rung.params, columns)
            expected = reference(BACKWARD_OPS[name], dtype, inputs)
            for output, (gradient, scale) in expected.items():
                stored = dtype.encode(np.asarray(found[output], np.float32))
                verdict = check.compare(dtype, gradient, scale, stored, TOLERANCE[dtype_name])
                assert verdict["within_bound"], (name, dtype_name, rows, cols, trial, output, verdict)


def test_the_bound_refuses_rows_whose_order_it_cannot_keep():
    """A warp summing float32 rows of 65536 elements (512 a lane) is past rtol 1e-5 for rmsnorm's
    gradient; a block of 512 threads keeps rows of 32768; bfloat16's rtol keeps both."""
    warp = {"threads": 256, "topology": "warp", "vec_bytes": 16}
    block = {"threads": 512, "topology": "block", "vec_bytes": 16}
    longest = space.longest_row("rmsnorm_backward", "float32", warp, 1e-5, 1e-6)
    assert longest is not None and 512 < longest < 65536
    assert 32768 < space.longest_row("rmsnorm_backward", "float32", block, 1e-5, 1e-6) < 65536
    assert space.longest_row("rmsnorm_backward", "bfloat16", warp, 1.6e-2, 1e-6) is None
    # softmax's gradient carries its sum's error once, rmsnorm's two and a half times
    assert space.longest_row("softmax_backward", "float32", warp, 1e-5, 1e-6) > longest
    assert math.isclose(BACKWARD_OPS["rmsnorm_backward"].row_gain, 2.5)
