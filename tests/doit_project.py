"""Running doit in-process on a throwaway copy of the project's inputs."""
from __future__ import annotations

import contextlib
import io
import os
import shutil
from pathlib import Path

from doit import cmd_run
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain

from aicg import nvrtc
from aicg.tasks import doit_tasks

REPO = Path(__file__).resolve().parents[1]

SMALL_PROFILE = """
[instance]
name = "small"
target = "h200"
preservation = "tolerance"

[plan]
candidates_per_family = 2

[[workload]]
ops = ["softmax", "row_sum"]
dtypes = ["float32"]
shapes = [[64, 1000]]
"""


def make_project(root: Path, profile: str = SMALL_PROFILE) -> Path:
    for name in ("rulesets", "hwdb", "kernels"):
        shutil.copytree(REPO / name, root / name)
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    (root / "rulesets/profiles/small.toml").write_text(profile)
    return root


class Run:
    def __init__(self, code: int, output: str, compilations: int):
        self.code, self.output, self.compilations = code, output, compilations

    @property
    def executed(self) -> list[str]:
        return [line[2:] for line in self.output.splitlines() if line.startswith(". ")]


def doit(project: Path, *args: str, cache: Path | None = None) -> Run:
    """Run `doit ARGS` in `project` with its own cache; output and compilations counted."""
    old_cwd, old_cache = Path.cwd(), os.environ.get("AICG_CACHE_DIR")
    os.chdir(project)
    os.environ["AICG_CACHE_DIR"] = str(cache or project / "cache")
    before = nvrtc.compilations
    out = io.StringIO()
    default_outfile = cmd_run.opt_outfile["default"]
    cmd_run.opt_outfile["default"] = out   # doit bound sys.stdout when it was imported
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            loader = ModuleTaskLoader({"task_instance": doit_tasks.task_instance, "DOIT_CONFIG": doit_tasks.DOIT_CONFIG})
            code = DoitMain(loader).run(list(args))
    finally:
        cmd_run.opt_outfile["default"] = default_outfile
        os.chdir(old_cwd)
        if old_cache is None:
            os.environ.pop("AICG_CACHE_DIR", None)
        else:
            os.environ["AICG_CACHE_DIR"] = old_cache
    return Run(code, out.getvalue(), nvrtc.compilations - before)
