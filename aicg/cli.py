"""`aicg`: doit with aicg's tasks, in any directory.

    aicg build [profile=PATH] [target=ENTRY|auto] [recache=1]
    aicg list | aicg help build | aicg explain op=softmax | aicg report
    aicg probe | aicg primitives [budget=SECONDS] | aicg record [| aicg record_validated]   (on a GPU node)

In a checkout `doit <command>` is the same (dodo.py exposes these tasks); an installed aicg
has no dodo.py to find, and this command brings its own. Inputs are this directory's or the
shipped ones (aicg/cli_layout.py); builds go to build/, the store to cache/.

Steps run in as many processes as the machine has cores (doit -n 1 for one) where no GPU is
present; on a GPU node one at a time: validations time kernels on the one GPU, and a worker
process forked from one that has loaded the CUDA driver (the freshness of a validation asks
it which GPU is here) cannot use the GPU.
"""
from __future__ import annotations

import sys

from .tasks import doit_tasks, probe_tasks


def processes() -> int:
    """How many processes a build runs its steps in by default."""
    from . import cli_graph
    if not cli_graph.no_gpu_here():
        return 1
    return cli_graph.cores()


DOIT_CONFIG = {**doit_tasks.DOIT_CONFIG, "num_process": processes()}


def tasks() -> dict:
    """The task creators and configuration of aicg's commands, as a dodo file holds them."""
    found = {"task_instance": doit_tasks.task_instance, "task_probe": probe_tasks.task_probe,
             "task_primitives": probe_tasks.task_primitives, "DOIT_CONFIG": DOIT_CONFIG}
    try:
        from .tasks import report_task
    except ImportError:   # a build of aicg without the report
        return found
    return {**found, "task_report": report_task.task_report}


def main(argv: list[str] | None = None) -> int:
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    class Main(DoitMain):
        BIN_NAME = "aicg"

    return Main(ModuleTaskLoader(tasks())).run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
