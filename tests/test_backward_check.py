"""The backward validation (aicg/backward/check.py) on a machine with no GPU: its device stands in
as host memory, and its "kernels" are the backward operators computed on the host from the
arguments a launch passes (pointers, strides, row counts), as the templates define them. A
faithful stand-in passes; each way a kernel can be wrong fails the check that exists to catch it:
a wrong value, an unwritten output, a write past an output, an input written, a result kept from
the previous launch, bits that change between runs (only where determinism is asked). CPU only."""
from __future__ import annotations

import json

import numpy as np
import pytest

from aicg.backward import check, codegen, space
from aicg.backward.ops import BACKWARD_OPS, draw
from aicg.backward.space import Candidate
from aicg.dtypes import DTYPES

SPACE = space.shipped()
TOLERANCE = {"float32": (1e-5, 1e-7), "bfloat16": (1.6e-2, 1e-5)}
SHAPES = [(3, 1), (37, 100), (300, 33), (9, 40, 44)]


class Memory:
    """Device memory as host bytes: allocations at addresses, a pointer anywhere inside one."""

    def __init__(self):
        self.blocks: dict[int, np.ndarray] = {}
        self.next = 1 << 20

    def allocate(self, nbytes: int) -> int:
        base = self.next
        self.blocks[base] = np.zeros(nbytes, np.uint8)
        self.next += -(-nbytes // 4096) * 4096 + 4096
        return base

    def at(self, ptr: int, nbytes: int) -> np.ndarray:
        for base, block in self.blocks.items():
            if base <= ptr and ptr + nbytes <= base + len(block):
                return block[ptr - base:ptr - base + nbytes]
        raise AssertionError(f"{nbytes} bytes at {ptr:#x} lie outside every allocation")


class FakeDriver:
    """What check.py asks of aicg/runtime/driver.py; a kernel's "cubin" is its candidate and faults."""

    def __init__(self, faults=()):
        self.memory, self.faults, self.launches = Memory(), set(faults), 0
        memory = self.memory

        class Buffer:
            def __init__(self, nbytes):
                self.nbytes = max(1, int(nbytes))
                self.ptr = memory.allocate(self.nbytes)

            def upload(self, host):
                data = np.ascontiguousarray(host).view(np.uint8).ravel()
                memory.at(self.ptr, len(data))[:] = data

            def download(self, dtype, count):
                return memory.at(self.ptr, count * np.dtype(dtype).itemsize).view(dtype).copy()

            def fill_byte(self, value, stream=0):
                memory.at(self.ptr, self.nbytes)[:] = value

            def free(self):
                pass

        driver = self

        class Kernel:
            def __init__(self, cubin, entry):
                self.candidate, self.entry = Candidate.from_record(json.loads(cubin)), entry

            def launch(self, grid, block, args, stream=0, shared_bytes=0):
                driver.launches += 1
                names = codegen.arguments(self.candidate)[self.entry]
                driver.run(self.candidate, self.entry, dict(zip(names, (value for value, _ in args))))

            def unload(self):
                pass

        class EventTimer:
            """Milliseconds as the launches the timed work made (the kernels take no time here)."""
            def time(self, work, stream=0):
                before = driver.launches
                work()
                return float(driver.launches - before)

        self.Buffer, self.Kernel, self.EventTimer = Buffer, Kernel, EventTimer

    def synchronize(self):
        pass

    def run(self, candidate: Candidate, entry: str, a: dict) -> None:
        op, dtype = BACKWARD_OPS[candidate.op], DTYPES[candidate.dtype]
        size, rows, cols = dtype.size, a["rows"] if "rows" in a else None, a["cols"]

        def matrix(name, stride):
            rows_of = [dtype.decode(self.memory.at(a[name] + r * stride * size, cols * size).view(dtype.storage))
                       for r in range(rows)]
            return np.array(rows_of, np.float64).reshape(rows, cols)

        if entry == codegen.ROWS_ENTRY:
            if self.launches > 1 and "stale" in self.faults:
                return
            inputs = {"g": matrix("g", a["g_stride"]), op.saved: matrix(op.saved, a[f"{op.saved}_stride"])}
            if op.vectors:
                inputs["w"] = dtype.decode(self.memory.at(a["w"], cols * size).view(dtype.storage)).astype(np.float64)
            dx = op.reference(**inputs, **dict(op.scalars))["dx"][0]
            if "wrong" in self.faults:
                dx = dx + 1.0
            if "noisy" in self.faults:
                dx = dx * (1 + 1e-7 * np.random.default_rng().standard_normal(dx.shape))
            out = dtype.encode(dx.astype(np.float32)).view(np.uint8).ravel()
            written = len(out) - (cols * size if "unwritten" in self.faults else 0)
            self.memory.at(a["dx"], written)[:] = out[:written]
            if "outside" in self.faults:
                self.memory.at(a["dx"] + len(out), 1)[:] = 0
            if "writes input" in self.faults:
                self.memory.at(a["g"], 1)[:] ^= 1
            if op.column_outputs:
                x = inputs["x"]
                mu = x.mean(axis=1) if len(op.column_outputs) == 2 else None
                centred = x - mu[:, None] if mu is not None else x
                r = 1 / np.sqrt((centred * centred).mean(axis=1) + op.scalars[0][1])
                stats = np.stack([mu, r], axis=1) if mu is not None else r[:, None]
                if candidate.partials_in_rows:
                    if a["partials"]:
                        self.write_partials(op, inputs["g"], x, stats, a)
                else:
                    self.memory.at(a["stats"], stats.size * 4)[:] = stats.astype(np.float32).view(np.uint8).ravel()
        elif entry == codegen.PARTIALS_ENTRY:
            kind = len(op.column_outputs)
            g, x = matrix("g", a["g_stride"]), matrix("x", a["x_stride"])
            stats = self.memory.at(a["stats"], rows * kind * 4).view(np.float32).reshape(rows, kind).astype(np.float64)
            self.write_partials(op, g, x, stats, a)
        else:
            kind = len(op.column_outputs)
            partials = self.memory.at(a["partials"], kind * a["chunks"] * cols * 4).view(np.float32)
            totals = partials.reshape(a["chunks"], kind, cols).astype(np.float64).sum(axis=0)
            for name, total in zip(op.column_outputs, totals):
                self.memory.at(a[name], cols * size)[:] = dtype.encode(total.astype(np.float32)).view(np.uint8)


    def write_partials(self, op, g, x, stats, a) -> None:
        """Each chunk's column sums, chunk by chunk: partials[chunk][output][column]."""
        kind, rows = len(op.column_outputs), g.shape[0]
        contributions = ([g * x * stats[:, :1]] if kind == 1 else [g * (x - stats[:, :1]) * stats[:, 1:], g])
        chunk = a["chunk_rows"]
        partials = np.stack([np.stack([c[i * chunk:(i + 1) * chunk].sum(axis=0) for c in contributions])
                             for i in range(-(-rows // chunk))]).astype(np.float32)
        if "a chunk unwritten" in self.faults:
            partials = partials[:-1]
        self.memory.at(a["partials"], partials.nbytes)[:] = partials.view(np.uint8).ravel()


def _validate(monkeypatch, name: str, dtype: str, faults=(), deterministic=False, shapes=SHAPES,
              rows_with_columns=False) -> dict:
    fake = FakeDriver(faults)
    monkeypatch.setattr(check, "driver", fake)
    family = SPACE.families[f"{name}_rows" + ("_with_columns" if rows_with_columns else "")]
    columns = SPACE.families[family.columns or "column_sum_two_pass"]
    has_columns = bool(BACKWARD_OPS[name].column_outputs)
    candidate = Candidate(name, dtype, family.name, dict(family.ladder[min(2, len(family.ladder) - 1)].params),
                          columns.name if has_columns else None, dict(columns.ladder[-1].params) if has_columns else None,
                          rows_with_columns)

    class Device:
        name = "a host standing in"
    return check.run(SPACE, json.dumps(candidate.as_record()).encode(), candidate, tolerance=TOLERANCE[dtype],
                     deterministic=deterministic, check_shapes=shapes, trials=2, device=Device())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_a_faithful_kernel_passes(monkeypatch, name, dtype):
    report = _validate(monkeypatch, name, dtype, deterministic=True)
    assert report["status"] == "passed", check.why_failed(report)
    assert len(report["checks"]) == 2 * len(SHAPES)
    assert all(set(c["outputs"]) == set(BACKWARD_OPS[name].outputs) for c in report["checks"])
    assert [c["shape"] for c in report["checks"]][-1] == [9, 40, 44]


@pytest.mark.parametrize("fault, found", [
    ("wrong", "dx: error"), ("unwritten", "dx: 40 outputs unwritten"), ("outside", "wrote outside its outputs"),
    ("writes input", "input overwritten"), ("stale", "a second input gave a wrong output"),
])
def test_each_fault_fails_the_check_made_for_it(monkeypatch, fault, found):
    report = _validate(monkeypatch, "layernorm_backward", "float32", faults=(fault,), shapes=[(9, 40, 44)])
    assert report["status"] == "failed"
    assert found in check.why_failed(report), check.why_failed(report)


def test_bits_that_change_between_runs_fail_only_where_determinism_is_asked(monkeypatch):
    shapes = [(37, 100)]
    assert _validate(monkeypatch, "softmax_backward", "float32", ("noisy",), False, shapes)["status"] == "passed"
    report = _validate(monkeypatch, "softmax_backward", "float32", ("noisy",), True, shapes)
    assert report["status"] == "failed" and "bits differ between runs" in check.why_failed(report)


def test_the_checked_shapes_are_the_awkward_ones_and_the_callers_cut_to_the_longest_row_kept():
    candidate = Candidate("rmsnorm_backward", "float32", "rmsnorm_backward_rows",
                          {"threads": 256, "topology": "warp", "vec_bytes": 16, "cache_packs": 4},
                          "column_sum_two_pass", dict(SPACE.families["column_sum_two_pass"].ladder[2].params))
    longest = space.longest_row("rmsnorm_backward", "float32", candidate.rows, 1e-5, 1e-6)
    shapes = check.check_shapes(SPACE, candidate, 1e-5, 1e-6, (256, 20000))
    assert (256, longest) in shapes and max(s[1] for s in shapes) == longest
    assert (9, longest, longest + 3) in shapes            # a strided shape keeps its padding
    assert (3, 1) in shapes and (37, 1000, 1024) in shapes


@pytest.mark.parametrize("name", ["rmsnorm_backward", "layernorm_backward"])
def test_column_sums_written_by_the_rows_part_are_checked_in_two_launches_at_a_chunk_edge(monkeypatch, name):
    """A candidate whose rows part writes the column sums' partials: its split run cuts the rows at
    a chunk's edge with the partials advanced to that chunk (else the second launch would write over
    the first's chunks and leave its own last ones poisoned); a chunk left unwritten fails."""
    shapes = [(300, 40), (9, 40, 44)]        # 300 rows: five chunks of 64, cut after the second
    report = _validate(monkeypatch, name, "float32", deterministic=True, shapes=shapes, rows_with_columns=True)
    assert report["status"] == "passed", check.why_failed(report)
    report = _validate(monkeypatch, name, "float32", ("a chunk unwritten",), True, shapes, rows_with_columns=True)
    assert report["status"] == "failed" and "dw: 40 outputs unwritten" in check.why_failed(report)


def test_a_candidate_summing_columns_in_its_rows_is_checked_only_on_rows_it_holds_whole():
    family = SPACE.families["rmsnorm_backward_rows_with_columns"]
    candidate = Candidate("rmsnorm_backward", "bfloat16", family.name, dict(family.ladder[0].params),
                          "column_sum_from_rows", dict(SPACE.families["column_sum_from_rows"].ladder[0].params), True)
    shapes = check.check_shapes(SPACE, candidate, 1.6e-2, 1e-6, (256, 4096))
    assert max(s[1] for s in shapes) == 4096 == space.held_cols(candidate.rows, "bfloat16")
    assert (9, 4096) in shapes and (9, 4096, 4099) in shapes and (256, 4096) in shapes


def test_timing_runs_every_launch_of_each_candidate_on_the_same_inputs(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(check, "driver", fake)
    one_pass = SPACE.families["rmsnorm_backward_rows_with_columns"]
    two_pass, totals = SPACE.families["rmsnorm_backward_rows"], SPACE.families["column_sum_from_rows"]
    candidates = [Candidate("rmsnorm_backward", "float32", one_pass.name, dict(one_pass.ladder[0].params),
                            totals.name, dict(totals.ladder[0].params), True),
                  Candidate("rmsnorm_backward", "float32", two_pass.name, dict(two_pass.ladder[0].params),
                            "column_sum_two_pass", dict(SPACE.families["column_sum_two_pass"].ladder[0].params))]

    from aicg.matrix import timing
    monkeypatch.setattr(timing, "driver", fake)

    class Flush:
        mode, runs = "write", 0

        def run(self, stream=0):
            Flush.runs += 1
    kernels = [(json.dumps(c.as_record()).encode(), c) for c in candidates]
    seconds = check.time_candidates(SPACE, kernels, (300, 2048), 3, Flush())
    assert seconds == [2e-3, 3e-3]          # the rows part and its totals; rows, partials and totals
    assert fake.launches == (timing.WARMUP + 3) * (2 + 3) and Flush.runs == 2 * 3
    with pytest.raises(ValueError, match="repetitions"):
        check.time_candidates(SPACE, kernels, (300, 2048), 0, Flush())

    # past DRAWN_ELEMENTS the rows drawn repeat down the matrices, the vectors as drawn
    drawn, uploaded = [], []
    monkeypatch.setattr(check, "DRAWN_ELEMENTS", 100 * 2048)
    monkeypatch.setattr(check, "draw", lambda op, dtype, rows, cols, trial, rng: drawn.append(rows) or
                        draw(op, dtype, rows, cols, trial, rng))
    monkeypatch.setattr(check.Buffers, "upload", lambda self, inputs: uploaded.append(inputs))
    check.time_candidates(SPACE, kernels[:1], (300, 2048), 1, Flush())
    [inputs] = uploaded
    assert drawn == [100] and inputs["g"].shape == inputs["x"].shape == (300, 2048) and inputs["w"].shape == (2048,)
    assert (inputs["x"][200:] == inputs["x"][:100]).all() and (inputs["g"][100:200] == inputs["g"][:100]).all()
