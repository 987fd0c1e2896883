"""Reports for people: an instance's HTML report, and the generated figures of the docs.

    python -m aicg.report build/<instance>     # build/<instance>/report.html (`doit report` does the same)
    python -m aicg.report --docs [--check]    # README.md's and docs/performance.md's generated parts
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import cas
from ..errors import InputError
from . import bench, instance as instances, page

REPORT = "report.html"


def write(instance_dir: Path, hwdb_dir: Path, bench_dir: Path | None, store: cas.Store | None = None) -> Path:
    """Write <instance_dir>/report.html from the instance (its files checked against their receipts,
    from `store` where changed or gone), the target's probe curves in `hwdb_dir` and the recorded
    runs in `bench_dir` (None, or a folder that is not there: no benchmark section)."""
    inst = instances.read(Path(instance_dir), store)
    target = instances.target_entry(inst.manifest)
    curves_path = Path(hwdb_dir) / f"{target}.curves.json"
    curves = None
    if curves_path.is_file():
        try:
            curves = json.loads(curves_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise InputError(curves_path, "(file)", "the probe curves as `doit probe` writes them", str(err)) from None
    runs = bench.runs(bench_dir) if bench_dir is not None and Path(bench_dir).is_dir() else []
    sources = [f"{instance_dir}/manifest.json, select/*.json, validation/*.json, hw/{target}.json (the build)"]
    if inst.realisation is not None:
        sources.append(f"{instance_dir}/source/hwdb/{target}.realisation.json (the lab's profile the build planned on)")
    if curves is not None:
        sources.append(f"{curves_path} (the probe curves)")
    if runs:
        sources.append(f"{bench_dir}/*.json (the recorded benchmark runs)")
    out = Path(instance_dir) / REPORT
    cas.write_atomic(out, page.render(inst, curves, runs, Path(hwdb_dir), sources).encode("utf-8"))
    return out
