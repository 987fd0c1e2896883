import math

import numpy as np
import pytest

from aicg.ops import EPS, OPERATORS

ROWS, COLS = 7, 33


@pytest.fixture
def data():
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((ROWS, COLS)) * 3, "r": rng.standard_normal((ROWS, COLS)) * 3,
            "w": rng.standard_normal(COLS), "b": rng.standard_normal(COLS)}


def run(name, data):
    op = OPERATORS[name]
    return op.reference(data["x"], **{v: data[v] for v in (*op.matrices, *op.vectors)}, **dict(op.scalars))


def test_softmax(data):
    x = data["x"]
    expected = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)   # no max shift: fine for |x| ~ 10
    y, scale = run("softmax", data)
    np.testing.assert_allclose(y, expected, rtol=1e-12)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-12)
    assert np.array_equal(scale, np.abs(y))


def test_log_softmax(data):
    x = data["x"]
    y, scale = run("log_softmax", data)
    np.testing.assert_allclose(y, np.log(np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.exp(y).sum(axis=1), 1.0, rtol=1e-12)
    assert np.all(y <= 0) and np.array_equal(scale, np.abs(y) + 1.0)
    shifted, _ = OPERATORS["log_softmax"].reference(np.array([[1000.0, 1000.0, 999.0]]))   # no overflow
    np.testing.assert_allclose(shifted[0], [-math.log(2 + math.exp(-1))] * 2 + [-1 - math.log(2 + math.exp(-1))],
                               rtol=1e-12)


def test_softmax_does_not_overflow_on_large_inputs():
    y, _ = OPERATORS["softmax"].reference(np.array([[1000.0, 1000.0, 999.0]]))
    e = math.exp(-1)
    np.testing.assert_allclose(y[0], [1 / (2 + e), 1 / (2 + e), e / (2 + e)], rtol=1e-12)


def test_row_sum(data):
    y, scale = run("row_sum", data)
    np.testing.assert_allclose(y, [math.fsum(row) for row in data["x"]], rtol=1e-12)
    np.testing.assert_allclose(scale, [math.fsum(abs(v) for v in row) for row in data["x"]], rtol=1e-12)


def test_row_max(data):
    y, scale = run("row_max", data)
    assert np.array_equal(y, [max(row) for row in data["x"]])
    assert np.array_equal(scale, np.abs(y))


def test_rmsnorm(data):
    x, w = data["x"], data["w"]
    expected = np.array([[v / math.sqrt(sum(u * u for u in row) / COLS + EPS) * w[j] for j, v in enumerate(row)]
                         for row in x])
    y, scale = run("rmsnorm", data)
    np.testing.assert_allclose(y, expected, rtol=1e-12)
    assert np.array_equal(scale, np.abs(y))


def test_layernorm(data):
    x, w, b = data["x"], data["w"], data["b"]
    mean = x.mean(axis=1, keepdims=True)
    expected = (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + EPS) * w + b
    y, scale = run("layernorm", data)
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-12)
    assert np.all(scale >= np.abs(y))          # the scale bounds the result (triangle inequality)


def test_bias_gelu_residual(data):
    x, r, b = data["x"], data["r"], data["b"]
    expected = [[(v + b[j]) * (1 + math.erf((v + b[j]) / math.sqrt(2))) / 2 + r[i][j] for j, v in enumerate(row)]
                for i, row in enumerate(x)]
    y, scale = run("bias_gelu_residual", data)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    assert np.all(scale >= np.abs(y))
    # where gelu(x + b) and r cancel, the scale still carries the inputs' size
    y, scale = OPERATORS["bias_gelu_residual"].reference(np.array([[2.0]]), np.array([[-1.9544997361036416]]),
                                                          np.array([0.0]))
    assert abs(y[0, 0]) < 1e-12 and scale[0, 0] > 3.9


def test_residual_rmsnorm_is_rmsnorm_of_the_sum(data):
    h = {**data, "x": data["x"] + data["r"]}
    y, _ = run("residual_rmsnorm", data)
    expected, _ = run("rmsnorm", h)
    np.testing.assert_allclose(y, expected, rtol=1e-12)
    y, scale = OPERATORS["residual_rmsnorm"].reference(np.array([[1.0, 2.0]]), np.array([[-1.0, 1.0]]),
                                                        np.array([1.0, 1.0]), EPS)
    assert scale[0, 0] > abs(y[0, 0])          # 1 - 1 = 0 cancels: the bound keeps the inputs' size


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_output_shapes(name, data):
    op = OPERATORS[name]
    y, scale = run(name, data)
    assert y.shape == scale.shape == op.output_shape(ROWS, COLS)
    assert op.output_shape(ROWS, COLS) == ((ROWS,) if name in {"row_sum", "row_max"} else (ROWS, COLS))
    assert np.all(scale >= 0) and np.all(scale >= np.abs(y) * (1 - 1e-15))


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_kernel_parameters_follow_the_argument_names(name):
    op = OPERATORS[name]
    params, names = op.kernel_params("float"), op.argument_names()
    assert len(params) == len(names)
    assert [p.split()[-1] for p in params] == names
    inputs = 1 + len(op.matrices) + len(op.vectors)
    assert names[:inputs] == ["x", *op.matrices, *op.vectors] and names[inputs] == "y"
    assert all(p.startswith("const float*") for p in params[:inputs])
    assert params[inputs].startswith("float*")
