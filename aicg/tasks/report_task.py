"""`doit report`: build the instance, then write its report for people.

    doit report [profile=...] [target=...]

Writes build/<instance>/report.html (aicg/report): each kernel's measured time, bandwidth and
share of the copy ceiling, the candidates it was chosen over, the legality facts once per rule,
and plots of the lab, the probes and the latest benchmark. It reads the instance's directory
(each file checked against its step's receipt, from the store where changed or gone), the
target's probe curves in hwdb/ and the recorded runs in docs/bench/ where the project has them.
"""
from __future__ import annotations

from pathlib import Path

from doit.exceptions import TaskFailed

from .. import cli_vars
from ..errors import InputError
from . import doit_tasks

BENCH_DIR = "docs/bench"


def run_report(instance_loader) -> dict | TaskFailed:
    from .. import report   # the page's code only where a report is written, not on every command
    instance = instance_loader()
    try:
        path = report.write(instance.env.instance_dir, instance.layout.hwdb, instance.layout.root / BENCH_DIR,
                            instance.env.store.local)
    except InputError as err:
        return TaskFailed(str(err))
    print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return {"report": str(path)}


def task_report():
    """The instance's report.html, after its build."""
    return {"basename": "report",
            "doc": "build the instance, then write build/<instance>/report.html: times, ceilings, candidates, plots",
            # the instance is loaded once per doit command, by task_instance's creator
            "actions": [(run_report, [lambda: doit_tasks._loaded["instance"]])],
            "task_dep": ["package"], "uptodate": [False], "verbosity": 2,
            "meta": cli_vars.meta(cli_vars.of_task("report"))}
