"""doit entry point of aicg: the task graph of one compiler instance.

    doit build [profile=rulesets/profiles/<name>.toml]
    doit probe | doit probe:<name>     (on a GPU node: measure it into hwdb/)
    doit primitives                     (on a GPU node: its realisation profile, beside the hwdb entry)
    doit report [profile=...]           (build/<instance>/report.html: times, candidates, plots)
    doit list --all | doit info <task> | doit clean

The graph and its mechanisms live in aicg/tasks; this file only exposes them.
"""
# aicg.cli: the same tasks and settings as the `aicg` command (parallel where no GPU is present)
from aicg.cli import DOIT_CONFIG  # noqa: F401
from aicg.tasks.doit_tasks import task_instance  # noqa: F401
from aicg.tasks.probe_tasks import task_primitives, task_probe  # noqa: F401
from aicg.tasks.report_task import task_report  # noqa: F401
