"""Running doit in-process on a throwaway copy of the project's inputs."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path

from doit import cmd_run
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain

from aicg import nvrtc
from aicg import target as targets
from aicg.tasks import doit_tasks, probe_tasks

REPO = Path(__file__).resolve().parents[1]

def profile_text(ops=("softmax", "row_sum"), dtypes=("float32",), shapes=((64, 1000),), per_family: int = 2,
                 preservation: str = "tolerance", extra: str = "") -> str:
    """A small profile named "small" for the H200 (GPU tests build it for theirs: target=auto);
    `extra` adds TOML tables (before the workload)."""
    def array(items):   # strings, numbers and nested sequences: JSON spells them as TOML does
        return json.dumps([list(i) if isinstance(i, tuple) else i for i in items])
    return (f'[instance]\nname = "small"\ntarget = "nvidia-h200"\npreservation = "{preservation}"\n\n'
            f"[plan]\ncandidates_per_family = {per_family}\n{extra}\n"
            f"[[workload]]\nops = {array(ops)}\ndtypes = {array(dtypes)}\nshapes = {array(shapes)}\n")


SMALL_PROFILE = profile_text()
# What a first build of SMALL_PROFILE compiles: softmax (two families) and row sum (the tree;
# the sequential family's order keeps float32's rtol only on rows of at most 660 elements, not
# the workload's 1000), two candidates each, ranked by the lab's measurements.
SMALL_PROFILE_COMPILATIONS = 6


def make_project(root: Path, profile: str = SMALL_PROFILE) -> Path:
    for name in ("rulesets", "hwdb", "kernels"):
        shutil.copytree(REPO / name, root / name)
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    (root / "rulesets/profiles/small.toml").write_text(profile)
    return root


def instance_dir(project: Path, target: str, profile: str = "small.toml") -> Path:
    """Where `doit build profile=rulesets/profiles/<profile> target=<target>` puts its instance."""
    return project / "build" / targets.instance_of(project / "rulesets/profiles" / profile, target)


def instance_files(project: Path, name: str = "small") -> dict[str, bytes]:
    """What an instance is made of, without the bookkeeping of how its build went."""
    root = project / "build" / name
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    bookkeeping = (".receipts/", ".tmp/", "provenance.json")
    return {n: data for n, data in files.items() if not n.startswith(bookkeeping)}


def receipt_keys(project: Path, name: str = "small") -> dict[str, str]:
    from aicg import digest
    receipts = project / "build" / name / ".receipts"
    return {p.name: digest.unpack(p.read_bytes())["key"] for p in receipts.iterdir()}


class Run:
    def __init__(self, code: int, output: str, compilations: int):
        self.code, self.output, self.compilations = code, output, compilations

    @property
    def executed(self) -> list[str]:
        return [line[2:] for line in self.output.splitlines() if line.startswith(". ")]


STORE_VARIABLES = ("AICG_CACHE_DIR", "AICG_REMOTE", "AICG_REMOTE_MODE", "AICG_REMOTE_TIMEOUT",
                   "AICG_SIGNING_KEY_FILE", "AICG_RECACHE")


def doit(project: Path, *args: str, cache: Path | None = None, env: dict | None = None) -> Run:
    """Run `doit ARGS` in `project` with its own cache (and `env` store settings);
    output and compilations counted."""
    old_cwd, saved = Path.cwd(), {k: os.environ.get(k) for k in STORE_VARIABLES}
    os.chdir(project)
    for k in STORE_VARIABLES:
        os.environ.pop(k, None)
    os.environ.update({"AICG_CACHE_DIR": str(cache or project / "cache"), **(env or {})})
    before = nvrtc.compilations
    out = io.StringIO()
    default_outfile = cmd_run.opt_outfile["default"]
    cmd_run.opt_outfile["default"] = out   # doit bound sys.stdout when it was imported
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            loader = ModuleTaskLoader({"task_instance": doit_tasks.task_instance, "task_probe": probe_tasks.task_probe,
                                       "task_primitives": probe_tasks.task_primitives,
                                       "DOIT_CONFIG": doit_tasks.DOIT_CONFIG})
            code = DoitMain(loader).run(list(args))
    finally:
        cmd_run.opt_outfile["default"] = default_outfile
        os.chdir(old_cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Run(code, out.getvalue(), nvrtc.compilations - before)
