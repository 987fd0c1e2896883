"""GPU test: an instance validated on the device dispatches each call to its shape's kernel.

Built for this machine's GPU (`target=auto`); skipped without a GPU that hwdb/ has an entry for. Run on
the device with `pytest -m gpu`.
"""
from __future__ import annotations

import json

import pytest

from aicg.runtime.instance import nearest_variant
from doit_project import doit, instance_dir, make_project, profile_text

pytestmark = pytest.mark.gpu

PROFILE = profile_text(ops=("softmax",), shapes=((300, 20000), (20000, 96)),
                       extra="[validation]\ntiming_repetitions = 5\n")


def test_each_shape_runs_the_kernel_measured_fastest_on_it(tmp_path, device_target):
    torch = pytest.importorskip("torch")
    import aicg
    project = make_project(tmp_path / "proj", PROFILE)
    run = doit(project, "build", "profile=rulesets/profiles/small.toml", "target=auto")
    assert run.code == 0, run.output
    root = instance_dir(project, device_target.target)
    entry = json.loads((root / "manifest.json").read_text())["kernels"]["softmax.float32"]
    assert entry["validation"] == "passed" and len(entry["dispatch"]) == 2
    # without the JIT an unseen shape (7x333) runs the nearest tuned shape's kernel
    inst = aicg.load(root, jit=False)
    for rows, cols in [(300, 20000), (20000, 96), (7, 333)]:
        x = torch.randn(rows, cols, device="cuda") * 3
        y = inst.softmax(x)
        ref = torch.softmax(x.double(), -1)
        assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-7)
        variant = nearest_variant(entry, rows, cols)
        assert (variant["cubin"], 0) in inst.softmax._loaded
