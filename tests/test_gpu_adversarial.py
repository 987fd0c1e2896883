"""GPU: validation that cannot be fooled, and the full repair loop.

Each kernel below is wrong in one of the ways weak validation lets through;
validation (under the deterministic preset) must reject every one and accept
the correct ones, compiled and validated for this machine's GPU (its hwdb entry). Skipped
without a GPU that hwdb/ has an entry for; run with `pytest -m gpu`.
"""
from __future__ import annotations

import json

import pytest

from aicg import nvrtc
from aicg.semantics import ruleset as ruleset_loader
from aicg.synth import proposal as proposals
from doit_project import REPO, doit, instance_dir, make_project
from llm_server import BROKEN, CORRECT, WRONG, ChatServer, answer, synth_profile

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("device_target")]

SUM = """
using G = aicg::RowGroup<THREADS, TOPOLOGY>;
const long long row = G::row();
{guard}
const T* xr = x + row * x_stride;
float acc = 0.0f;
aicg::for_each<1>(xr, cols, G::lane(), G::lanes, false, [&](int j, float v) {{ {accumulate} }});
acc = aicg::row_reduce<THREADS, TOPOLOGY>(acc, aicg::Sum());
if (G::lane() == 0) {{ {store} }}
"""


def body(guard="if (row >= rows) return;", accumulate="acc += v;", store="y[row] = acc;"):
    return SUM.format(guard=guard, accumulate=accumulate, store=store)


RACY = """
using G = aicg::RowGroup<THREADS, TOPOLOGY>;
const long long row = G::row();
if (row >= rows) return;
float acc = 0.0f;
aicg::for_each<1>(x + row * x_stride, cols, G::lane(), G::lanes, false, [&](int, float v) { acc += v; });
if (G::lane() == 0) y[row] = 0.0f;   // no barrier: other threads may add before this store
atomicAdd(&y[row], acc);
"""

WRONG_KERNELS = {
    "writes nothing": "return;",
    "writes a constant": body(store="y[row] = 0.0f;"),
    "computes only the first rows": body(guard="if (row >= rows || row >= 4) return;"),
    "computes only the first block": body(guard="if (row >= rows || blockIdx.x != 0) return;"),
    "keeps a previous result": body(guard="if (row >= rows || y[row] == y[row]) return;"),   # skips unless poisoned
    "races between threads": RACY,
    "right only on its tuned sizes": body(accumulate="if (j < cols - cols % 32) acc += v;"),
    "modifies its input": body(store="y[row] = acc; const_cast<T*>(xr)[0] = 0.0f;"),
    "writes past its output": body(store="y[row] = acc; if (row == rows - 1) y[rows] = acc;"),
    "does no work where the timer looks": body(guard="if (row >= rows || rows > 4000) return;"),
}

PARAMS = {"threads": 256, "topology": "block"}


def _validate(body_text: str, target):
    from aicg.validate import validate_on_device
    rules = ruleset_loader.load(REPO / "rulesets")
    p = proposals.Proposal("test", "source", (), PARAMS, body=body_text)
    source, main = proposals.render(p, "row_sum", "float32", rules, "adversarial")
    headers = {}
    for h in proposals.headers_for(p, main):
        headers.update(nvrtc.include_closure(h, REPO / "kernels"))
    cubin, _, _ = nvrtc.compile_cubin(source, "adversarial.cu", headers, target.arch)
    return validate_on_device(cubin, target, "row_sum", "float32", PARAMS,
                              tolerance=(1e-5, 1e-7), deterministic=True, bitwise=False,
                              check_shapes=[(3, 1), (5, 7), (37, 1000), (9, 4097), (3001, 33), (64, 4096)],
                              timed_shapes=[(32768, 4096)], trials=2, repetitions=5)


@pytest.mark.parametrize("name", sorted(WRONG_KERNELS))
def test_validation_rejects(name, device_target):
    result = _validate(WRONG_KERNELS[name], device_target)
    assert result["status"] == "failed", (name, result)


@pytest.mark.parametrize("name, text, fault", [
    ("faults", body(store="y[row] = acc; if (row == 0) y[-(1ll << 40)] = acc;"), "CUDA"),
    ("never finishes", body(store="y[row] = acc; while (rows > 0) __nanosleep(1000);"), "no answer"),
])
def test_a_kernel_that_faults_or_never_finishes_fails_and_the_next_is_validated(name, text, fault, monkeypatch,
                                                                              device_target):
    from aicg.validate import isolated
    monkeypatch.setattr(isolated.worker, "seconds", 60)
    result = _validate(text, device_target)
    assert result["status"] == "failed" and fault in result["fault"], (name, result)
    assert _validate(body(), device_target)["status"] == "passed"


def test_validation_accepts_a_correct_kernel(device_target):
    result = _validate(body(), device_target)
    assert result["status"] == "passed", [c for c in result["checks"] if not c["passed"]][:2]
    assert result["timings"] and not result["implausibly_fast"]




def test_the_loop_repairs_a_failing_proposal_into_a_valid_kernel(tmp_path, device_target):
    server = ChatServer([answer(BROKEN), answer(WRONG), answer(CORRECT)])
    try:
        project = make_project(tmp_path / "p", synth_profile(server.url, shapes="[[2048, 4096]]"))
        run = doit(project, "build", "profile=rulesets/profiles/small.toml", "target=auto")
    finally:
        server.stop()
    assert run.code == 0, run.output
    root = instance_dir(project, device_target.target)
    manifest = json.loads((root / "manifest.json").read_text())
    rounds = manifest["synthesis"]["softmax.float32"]
    assert [r["outcome"] for r in rounds] == ["compile_error", "invalid", "accepted"]
    assert "error/bound" in rounds[1]["feedback"]          # the validation statistics were fed back
    selection = json.loads((root / "select/softmax.json").read_text())
    assert any(r["id"] == "synth:softmax.float32" and r["status"] == "passed"
               for r in selection["dtypes"]["float32"]["candidates"])
