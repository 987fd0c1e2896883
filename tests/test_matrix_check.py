"""aicg/matrix/check.py and worker.py driven end to end without a GPU: device memory stands in
as host memory, and emulated kernels (the kernels' arithmetic in numpy, tests/test_matrix_host.py)
are launched through the same calls. A right kernel passes; wrong ones fail for the reason
they are wrong: a skipped k slice, writing past its output, into a row's padding, leaving
poison, keeping a stale result, differing bits between runs, writing its inputs."""
from __future__ import annotations

import numpy as np
import pytest

from aicg import nvrtc
from aicg.matrix import check, reference, space, timing, worker
from aicg.matrix.problem import Problem
from aicg.matrix.space import Epilogue
from aicg.matrix.templates import RULES
from test_matrix_host import emulate

TRIED = {name: tpl.tried for name, tpl in space.templates().items()}


class HostMemory:
    """Buffers at made-up device addresses, backed by bytearrays."""

    def __init__(self):
        self.blocks, self.next = {}, 1 << 20

    def find(self, address: int, nbytes: int) -> memoryview:
        for base, block in self.blocks.items():
            if base <= address and address + nbytes <= base + len(block):
                return memoryview(block)[address - base:address - base + nbytes]
        raise AssertionError(f"{nbytes} bytes at {address:#x}: outside every buffer")


@pytest.fixture
def memory(monkeypatch):
    mem = HostMemory()

    class Buffer:
        def __init__(self, nbytes):
            self.nbytes = max(1, int(nbytes))
            self.ptr = mem.next
            mem.blocks[self.ptr] = bytearray(self.nbytes)
            mem.next += (self.nbytes + 4095) // 4096 * 4096 + 4096

        def upload(self, host):
            data = np.ascontiguousarray(host).view(np.uint8).reshape(-1)
            mem.blocks[self.ptr][:data.size] = data.tobytes()

        def download(self, dtype, count):
            return np.frombuffer(bytes(mem.blocks[self.ptr]), dtype=dtype, count=count).copy()

        def fill_byte(self, value, stream=0):
            mem.blocks[self.ptr][:] = bytes([value]) * self.nbytes

        def free(self):
            mem.blocks.pop(self.ptr, None)

    monkeypatch.setattr(check.driver, "Buffer", Buffer)
    monkeypatch.setattr(check.driver, "synchronize", lambda: None)
    monkeypatch.setattr(check, "wait", lambda stream=0, seconds=0: None)
    return mem


def read(mem, address, rows, row, ld):
    """A stored matrix (rows of `row` elements, `ld` apart) as uint16."""
    count = (rows - 1) * ld + row
    flat = np.frombuffer(bytes(mem.find(address, 2 * count)), np.uint16)
    full = np.concatenate([flat, np.zeros(rows * ld - count, np.uint16)]).reshape(rows, ld)
    return full[:, :row]


class EmulatedKernel:
    """Reads its operands from `memory` as a kernel would, computes as emulate() does, writes C;
    `fault` makes it wrong in one way."""

    def __init__(self, real, mem, fault=None):
        self.real, self.mem, self.fault, self.launches = real, mem, fault, 0

    def geometry(self, problem):
        return RULES[self.real.template].geometry(self.real, problem, 132, 66)

    def launch(self, p: Problem, pointers, stream=0):
        self.launches += 1
        dt = reference.DTYPES[p.dtype]
        a = dt.decode(read(self.mem, pointers["a"], *p.a_stored, p.lda))
        b = dt.decode(read(self.mem, pointers["b"], *p.b_stored, p.ldb))
        logical = {"a": a if p.a_major == "k" else a.T, "b": b.T if p.b_major == "k" else b}
        if p.epilogue.bias:
            logical["bias"] = dt.decode(read(self.mem, pointers["bias"], 1, p.n, p.n)).reshape(-1)
        if p.epilogue.residual:
            logical["residual"] = dt.decode(read(self.mem, pointers["residual"], p.m, p.n, p.ldr))
        rows = np.arange(p.m)
        skip = slice(0, 16) if self.fault == "skip k" else None
        bits = emulate(p, logical, rows, skip_k=skip)
        if self.fault == "stale" and self.launches > 2:
            return                       # the third launch (fresh inputs, no poison) writes nothing
        if self.fault == "flaky" and self.launches == 2:
            bits = bits ^ np.uint16(1)
        if self.fault == "poison left":
            bits[-1, -1] = reference.POISON_BITS
        c = self.mem.find(pointers["c"], 2 * p.elements("c"))
        image = np.frombuffer(c, np.uint16).copy()
        for r in range(p.m):
            image[r * p.ldc:r * p.ldc + p.n] = bits[r]
        if self.fault == "padding" and p.ldc > p.n:
            image[p.n] = 0
        c[:] = image.tobytes()
        if self.fault == "past the end":
            self.mem.find(pointers["c"] + 2 * p.elements("c"), 2)[:] = b"\0\0"
        if self.fault == "writes input":
            self.mem.find(pointers["a"], 2)[:] = b"\0\0"


def validate(mem, real, problem, fault=None):
    rng = np.random.default_rng(11)
    trials = [reference.draw(problem, t, rng) for t in range(2)]
    rows = reference.checked_rows(problem.m, rng)
    refs = [reference.expected(problem, t, rows) for t in trials]
    operands = check.Operands(problem)
    try:
        return check.validate(EmulatedKernel(real, mem, fault), problem, trials, rows, operands, refs)
    finally:
        operands.free()


@pytest.mark.parametrize("template, a, b, epilogue", [
    ("wgmma", "k", "k", Epilogue()), ("wgmma", "mn", "mn", Epilogue("gelu_erf", True, True)),
    ("mma", "k", "mn", Epilogue("silu", residual=True)), ("gemv", "k", "k", Epilogue("gelu_tanh", bias=True))])
def test_a_right_kernel_passes_with_padding_and_guards_checked(memory, template, a, b, epilogue):
    real = space.realisation(template, "bfloat16", a, b, epilogue, **TRIED[template][0])
    m = 7 if template == "gemv" else 67
    base = Problem(m, 45, 136, "bfloat16", a, b, epilogue)
    problem = Problem(m, 45, 136, "bfloat16", a, b, epilogue, lda=base.a_stored[1] + 8, ldb=base.b_stored[1] + 8,
                      ldc=47, ldr=49)
    report = validate(memory, real, problem)
    assert report["status"] == "passed", report
    first, second = report["checks"]
    assert first["poisoned"] and not second["poisoned"] and first["repeatable"]
    assert first["guards_intact"] and first["padding_intact"] and first["inputs_intact"]


@pytest.mark.parametrize("fault, failed", [
    ("skip k", "within_bound"), ("past the end", "guards_intact"), ("padding", "padding_intact"),
    ("poison left", "within_bound"), ("stale", "within_bound"), ("flaky", "repeatable"),
    ("writes input", "inputs_intact")])
def test_a_wrong_kernel_fails_for_its_reason(memory, fault, failed):
    real = space.realisation("wgmma", "bfloat16", "k", "k", Epilogue(), **TRIED["wgmma"][0])
    problem = Problem(40, 24, 64, ldc=26)
    report = validate(memory, real, problem, fault)
    assert report["status"] == "failed"
    assert any(c.get(failed) is False for c in report["checks"]), report
    if fault == "poison left":
        assert report["checks"][0]["unwritten"] == 1
        assert report["checks"][0]["mismatch"]["unwritten_rows"] == "39"


def test_worker_case_validates_and_times_through_the_same_path(memory, monkeypatch):
    real = space.realisation("mma", "bfloat16", "k", "k", Epilogue(), **TRIED["mma"][0])
    problem = Problem(33, 17, 64)
    kernel = EmulatedKernel(real, memory)
    monkeypatch.setattr(worker, "_kernel", lambda r, cubin: kernel)
    monkeypatch.setattr(worker.driver, "use_primary_context", lambda: None)
    flushes = []
    monkeypatch.setattr(worker, "_l2_flush", lambda mode: flushes.append(mode) or mode)
    monkeypatch.setattr(worker.timing, "median_seconds",
                        lambda launch, flush, reps: (launch(), {"median_seconds": 1e-3, "repetitions": reps})[1])
    worker._problem.clear()
    out = worker.run_case(real.as_dict(), b"cubin", problem.as_dict(), repetitions=3)
    assert out["validation"]["status"] == "passed"
    assert out["timing"]["tflops"] == pytest.approx(problem.flops / 1e-3 / 1e12)
    assert flushes == ["read"]     # the L2 left clean before each repetition unless asked otherwise
    again = worker.run_case(real.as_dict(), b"cubin", problem.as_dict(), repetitions=0)
    assert again["validation"]["status"] == "passed" and "timing" not in again
    worker._problem["operands"].free()
    worker._problem.clear()


def test_the_l2_read_flush_compiles_without_a_gpu_and_an_unknown_flush_is_refused():
    cubin, report, _ = nvrtc.compile_cubin(timing.READ_SOURCE, "l2_flush.cu", {}, "sm_90")
    assert cubin and report["reported"] and report["spill_store_bytes"] == 0
    with pytest.raises(ValueError, match="flush = 'sideways': expected one of read, write"):
        timing.L2Flush("sideways")
