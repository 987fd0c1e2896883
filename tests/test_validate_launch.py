"""How validation launches a kernel over part of a matrix, without a GPU: the
device buffers and the kernel are stand-ins that record what they are given."""
from __future__ import annotations

import pytest

from aicg.dtypes import DTYPES
from aicg.ops import OPERATORS
from aicg.validate import check

PARAMS = {"threads": 128, "vec_bytes": 16, "topology": "warp", "fast_exp": False, "cache_packs": 0}


class StandInBuffer:
    allocated = 0

    def __init__(self, nbytes):
        StandInBuffer.allocated += 1
        self.ptr = StandInBuffer.allocated << 32   # distinct, and never dereferenced


class RecordingKernel:
    def __init__(self, op: str = "rmsnorm"):
        self.names, self.launches = OPERATORS[op].argument_names(), []

    def launch(self, grid, block, args, stream=0, shared_bytes=0):
        self.launches.append((grid, block, dict(zip(self.names, args))))


@pytest.fixture
def buffers(monkeypatch):
    monkeypatch.setattr(check.driver, "Buffer", StandInBuffer)
    return lambda rows, cols, op="rmsnorm": check.Buffers(OPERATORS[op], DTYPES["float32"], rows, cols)


def test_a_split_launch_covers_each_row_once_from_its_own_offset(buffers):
    b, kernel = buffers(10, 7), RecordingKernel()
    b.launch(kernel, PARAMS, 0, 4)
    b.launch(kernel, PARAMS, 4)
    (g1, _, a1), (g2, _, a2) = kernel.launches
    assert (a1["rows"][0], a2["rows"][0]) == (4, 6)
    assert a2["x"][0] - a1["x"][0] == a2["y"][0] - a1["y"][0] == 4 * 7 * 4
    assert a2["w"] == a1["w"]   # per-column vectors are not offset
    assert g1 * 4 >= 4 and g2 * 4 >= 6     # a warp per row, four rows per block


def test_the_empty_half_of_a_one_row_split_launches_nothing(buffers):
    """A grid of no blocks is a CUDA error (it failed a JIT validation of a one-row shape)."""
    b, kernel = buffers(1, 65536), RecordingKernel()
    b.launch(kernel, PARAMS, 0, (1 + 1) // 2)
    b.launch(kernel, PARAMS, (1 + 1) // 2)
    assert len(kernel.launches) == 1 and kernel.launches[0][2]["rows"][0] == 1


def test_a_residual_is_offset_like_x(buffers):
    b, kernel = buffers(10, 7, "residual_rmsnorm"), RecordingKernel("residual_rmsnorm")
    b.launch(kernel, PARAMS, 0, 4)
    b.launch(kernel, PARAMS, 4)
    (_, _, a1), (_, _, a2) = kernel.launches
    assert a2["r"][0] - a1["r"][0] == a2["x"][0] - a1["x"][0] == 4 * 7 * 4
    assert a1["r"][0] != a1["x"][0] and a2["w"] == a1["w"]


def test_strided_rows_are_offset_by_the_stride_and_their_padding_is_poison(monkeypatch):
    monkeypatch.setattr(check.driver, "Buffer", StandInBuffer)
    op, dtype = OPERATORS["residual_rmsnorm"], DTYPES["float32"]
    b, kernel = check.Buffers(op, dtype, 10, 7, stride=9), RecordingKernel("residual_rmsnorm")
    b.launch(kernel, PARAMS, 0, 4)
    b.launch(kernel, PARAMS, 4)
    (_, _, a1), (_, _, a2) = kernel.launches
    assert a1["x_stride"] == a1["r_stride"] == (9, "int")
    assert a2["x"][0] - a1["x"][0] == a2["r"][0] - a1["r"][0] == 4 * 9 * 4
    assert a2["y"][0] - a1["y"][0] == 4 * 7 * 4          # the output stays dense
    import numpy as np
    inputs = check.draw(op, dtype, 10, 7, 0, np.random.default_rng(0))
    stored = b.stored(inputs)
    x = stored["x"].reshape(10, 9)
    assert np.array_equal(x[:, :7], inputs["x"]) and np.isnan(x[:, 7:]).all()
    assert stored["w"] is inputs["w"]                      # vectors are dense
    with pytest.raises(ValueError, match="shorter than a row"):
        check.Buffers(op, dtype, 10, 7, stride=6)
def test_long_rows_are_checked_on_fewer_rows_but_never_on_few():
    assert check.rows_checked(1) == check.rows_checked(4096) == check.ROWS_CHECKED
    assert check.rows_checked(32768) * 32768 <= check.ELEMENTS_CHECKED
    assert check.rows_checked(1 << 20) == check.MIN_ROWS_CHECKED


def test_a_failed_validation_says_what_it_found_first():
    from aicg.validate import why_failed
    passed = {"shape": [5, 7], "trial": 0, "passed": True}
    wrong = {"shape": [1, 65536], "trial": 1, "passed": False, "unwritten": 0, "within_bound": False,
             "worst_error_over_bound": 3.5, "max_abs_error": 2e-6, "input_intact": True, "repeatable": True,
             "fresh_output": False}
    line = why_failed({"status": "failed", "checks": [passed, wrong]})
    assert line == "1x65536 trial 1: error 3.5x the bound (max |y - ref| 2e-06), a second input gave a wrong output"
    assert why_failed({"status": "failed", "checks": [passed], "implausibly_fast": [[2048, 4096]]}).startswith(
        "implausibly fast at [[2048, 4096]]")
    assert why_failed({"status": "passed", "checks": [passed]}) == ""
    assert why_failed({"status": "unvalidated", "reason": "no GPU on this machine"}) == "no GPU on this machine"


class MemoryBuffer:
    """Device memory as host bytes, found again by the address a kernel is given."""
    by_ptr: dict[int, "MemoryBuffer"] = {}

    def __init__(self, nbytes):
        self.nbytes, self.bytes = nbytes, bytearray(nbytes)
        self.ptr = (len(MemoryBuffer.by_ptr) + 1) << 32
        MemoryBuffer.by_ptr[self.ptr] = self

    def fill_byte(self, value, stream=0):
        self.bytes[:] = bytes([value]) * self.nbytes

    def download(self, dtype, count):
        import numpy as np
        return np.frombuffer(bytes(self.bytes), dtype=dtype, count=count).copy()

    def upload(self, host):
        pass

    @classmethod
    def at(cls, address):
        base = max(p for p in cls.by_ptr if p <= address)
        return cls.by_ptr[base], address - base


class RowSumWriting:
    """A row sum that writes 1.0 to each output of its rows, and `extra` elements beyond them
    (negative: before the first)."""

    def __init__(self, extra=0):
        self.extra, self.names = extra, OPERATORS["row_sum"].argument_names()

    def launch(self, grid, block, args, stream=0, shared_bytes=0):
        import struct
        named = dict(zip(self.names, args))
        buffer, at = MemoryBuffer.at(named["y"][0])
        rows = named["rows"][0]
        first, last = (min(0, self.extra), rows + max(0, self.extra))
        for i in range(first, last):
            buffer.bytes[at + 4 * i:at + 4 * i + 4] = struct.pack("<f", 1.0)


@pytest.mark.parametrize("extra, outside", [(0, False), (1, True), (-1, True)])
def test_a_kernel_writing_outside_its_output_is_seen(monkeypatch, extra, outside):
    monkeypatch.setattr(check.driver, "Buffer", MemoryBuffer)
    monkeypatch.setattr(check.driver, "synchronize", lambda: None)
    b = check.Buffers(OPERATORS["row_sum"], DTYPES["float32"], 10, 7)
    y = b.run_poisoned(RowSumWriting(extra), PARAMS)
    assert y.view("float32").tolist() == [1.0] * 10    # the output itself, guards left out
    assert b.wrote_outside is outside


@pytest.mark.parametrize("stored, right", [(float("inf"), True), (float("-inf"), False), (65504.0, False)])
def test_a_result_past_the_dtype_range_must_be_stored_as_an_infinity_of_its_sign(stored, right):
    import numpy as np
    f16, rows, cols = DTYPES["float16"], 2, 32768
    x = np.full((rows, cols), 3.0, dtype=np.float32)
    x[1] = 1e-3                                     # the second row's sum, 32.8, stays in range
    y = np.array([stored, 32.768], dtype=np.float32)
    result = check._compare(OPERATORS["row_sum"], f16, {"x": f16.encode(x)}, f16.encode(y), rows, cols,
                            (1e-3, 1e-5))
    assert result["within_bound"] is right


@pytest.mark.parametrize("op, expected", [("row_sum", 4096 * 512 + 4096), ("rmsnorm", 2 * 4096 * 512 + 512),
                                          ("residual_rmsnorm", 3 * 4096 * 512 + 512),
                                          ("bias_gelu_residual", 3 * 4096 * 512 + 512)])
def test_a_timed_launch_is_credited_with_every_input_matrix_it_reads(op, expected):
    assert check.moved_bytes(OPERATORS[op], DTYPES["bfloat16"], 4096, 512) == 2 * expected
