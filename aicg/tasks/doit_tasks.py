"""The instance's steps as doit tasks, and the reporter that summarises a build.

`dodo.py` re-exports `task_instance` and `DOIT_CONFIG`. One creator yields
every task (basename = step kind, name = subject), so the graph is computed
once per load, or read from where the last load kept it (aicg/cli_graph.py).
Up-to-dateness is the steps' own (key and receipt, see step.py); doit's
database is local bookkeeping only.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from doit import get_var
from doit.exceptions import InvalidDodoFile, TaskFailed
from doit.reporter import ConsoleReporter

from .. import build_lock, cas, cli_graph, cli_layout, cli_progress, cli_vars, nvrtc
from ..errors import CompileError, DeviceError, InputChanged, InputError, UnknownTarget
from . import record_task, step as steps, summary

DEFAULT_PROFILE = cli_vars.DEFAULT_PROFILE

KIND_DOCS = {
    "hw": "resolve the target's hwdb entry (measured facts over datasheet)",
    "legality": "decide, per operator, the legal rules and families and why",
    "plan": "enumerate legal candidates per operator and rank them by the cost prior",
    "codegen": "instantiate a family template as a complete CUDA source",
    "compile": "compile a candidate with NVRTC to a cubin, with its resource report",
    "validate": "check a candidate against float64 on the target GPU and time it (cached by cubin and GPU)",
    "select": "choose the fastest valid candidate per operator and dtype",
}

# What the reporter (and tasks defined elsewhere) read of the instance being built:
# "instance" -> cli_graph.LoadedGraph (its attributes beyond the graph load the instance in full).
_loaded: dict = {}


def _notes(instance, root: Path) -> list[str]:
    from .. import target as targets
    from ..primitives import realisation
    layout, prof = instance.layout, instance.profile
    has_realisation = realisation.path_for(layout.hwdb, prof.target).exists()
    has_matrix = None
    if instance.matrix is not None:   # the matrix profile its plan was calibrated by, as it loaded
        found = instance.matrix.measured
        has_matrix = found.profile.path.name if found and found.borrowed else found is not None
    shown = layout.hwdb.relative_to(root) if layout.hwdb.is_relative_to(root) else layout.hwdb
    return targets.notes(instance.hardware, has_realisation, prof.prior, shown, has_matrix)


def load() -> cli_graph.LoadedGraph:
    """The instance of profile=... (default: DEFAULT_PROFILE), for target=... (default: the
    profile's own; "auto": this machine's GPU; aicg/target.py)."""
    root = Path.cwd()
    try:
        cli_vars.check(cli_vars.given())
        layout = cli_layout.resolve(root)
        profile = cli_layout.profile_path(get_var("profile", DEFAULT_PROFILE), root)
        recache = get_var("recache", "0") not in ("", "0")
        loaded = cli_graph.load(layout, profile, get_var("target", None) or None, recache,
                                lambda instance: _notes(instance, layout.root))
    except UnknownTarget as err:
        raise NoInstance(str(err)) from None
    except (InputError, CompileError) as err:
        raise InvalidDodoFile(str(err)) from None
    _loaded["instance"], _loaded["pid"] = loaded, os.getpid()
    for note in loaded.notes:
        print(f"aicg: {note}", file=sys.stderr, flush=True)
    return loaded


def _action(name: str, loaded: cli_graph.LoadedGraph):
    counted = dict(loaded.env.store.stats)
    try:
        if name.startswith("compile:") and not loaded.compiled_ahead and compiles_ahead():
            loaded.compiled_ahead = True
            try:
                loaded.compile_ahead()
            except Exception as err:   # noqa: BLE001 - only a head start: each step compiles its own and says what fails
                print(f"aicg: the kernels are compiled one at a time ({type(err).__name__}: {err})", file=sys.stderr)
        origin = steps.execute(loaded.step(name), loaded.env)
    except (InputError, CompileError, InputChanged, DeviceError, cli_graph.GraphChanged) as err:
        return TaskFailed(str(err))
    values = {"origin": origin if origin in ("local", "remote", "record") else "ran"}
    if os.getpid() != _loaded.get("pid"):   # a doit -n worker: its store's counters go back with the result
        values["store"] = {k: n - counted.get(k, 0) for k, n in loaded.env.store.stats.items() if n != counted.get(k, 0)}
    return values


def compiles_ahead() -> bool:
    """Whether the build compiles its kernels ahead on threads (nvrtc.compile_ahead): where a GPU
    makes it run its steps one at a time, in this process (a forked -n worker has none of the
    parent's threads, and a pool does not survive a fork)."""
    return os.getpid() == _loaded.get("pid") and not cli_graph.no_gpu_here()


def _task(step: steps.Step, loaded: cli_graph.LoadedGraph, meta: dict) -> dict:
    basename, _, name = step.name.partition(":")
    task = {"basename": basename, "doc": step.doc,
            "actions": [(_action, [step.name, loaded])],
            "uptodate": [lambda: loaded.is_fresh(step)],
            "targets": [str(loaded.env.instance_dir / t) for t in step.targets]
                       + [str(loaded.env.receipt_path(step.name))],
            "task_dep": list(step.upstream),
            "clean": [(steps.clean, [step, loaded.env])],
            "meta": meta}
    if name:
        task["name"] = name
    return task


def task_instance():
    """Tasks of the compiler instance selected by profile=... (default: rulesets/profiles/default.toml)
    and target=... (default: the profile's)."""
    try:
        loaded = load()
    except NoInstance as err:
        yield from _unloadable(str(err))
        return
    graph_meta = cli_vars.meta(cli_vars.of_task("build"))
    for kind, doc in KIND_DOCS.items():
        yield {"basename": kind, "name": None, "doc": doc, "meta": graph_meta}
    for step in loaded.steps:
        yield _task(step, loaded, graph_meta)
    yield {"basename": "build", "doc": f"build compiler instance {loaded.name} into build/{loaded.name}/ (default)",
           "actions": None, "task_dep": ["package"], "meta": graph_meta}
    yield {"basename": "record", "doc": f"build {loaded.name}, then write what this GPU validated to "
                                        f"hwdb/{loaded.target}.validations.jsonl",
           "actions": [(_record, [loaded])], "task_dep": ["package"], "uptodate": [False],
           "verbosity": 2, "meta": graph_meta}
    yield {"basename": "record_validated", "doc": f"write what this GPU has validated of {loaded.name} so far to "
                                                  f"hwdb/{loaded.target}.validations.jsonl, building nothing "
                                                  f"(after a build cut short)",
           "actions": [(_record, [loaded])], "uptodate": [False], "verbosity": 2, "meta": graph_meta}
    yield {"basename": "explain", "doc": "print why rules and families are legal or not: doit explain [op=..] [dtype=..] [profile=..]",
           "actions": [(_explain, [loaded])], "uptodate": [False], "verbosity": 2,
           "meta": cli_vars.meta(cli_vars.of_task("explain"))}
    # the page changes with the rule sets and with the code that renders them
    rule_files = sorted(str(p) for p in loaded.layout.rules.glob("*.toml"))
    rule_files += [str(cli_graph.AICG_DIR / "semantics" / m) for m in EXPLORER_CODE]
    yield {"basename": "explore", "doc": f"write the operator explorer page to {EXPLORER}",
           "actions": [(_explore, [loaded])], "file_dep": rule_files, "targets": [EXPLORER], "clean": True,
           "verbosity": 2, "meta": graph_meta}


class NoInstance(Exception):
    """The profile's target has no hwdb entry yet: the instance's tasks fail, the rest run."""


def _unloadable(message: str):
    """The instance's tasks when the profile's target has no hwdb entry yet: each fails with the
    reason, and the commands that need no instance run, `doit probe` among them, which is how a
    GPU's entry comes to exist."""
    def fail():
        return TaskFailed(message)
    for basename in ("package", "build", "record", "record_validated", "explain", "explore"):
        yield {"basename": basename, "doc": f"(cannot load the instance: {message.splitlines()[0]})",
               "actions": [fail], "uptodate": [False], "verbosity": 2}


EXPLORER = "build/explore/index.html"
EXPLORER_CODE = ("explore.py", "legality.py", "accuracy.py", "ruleset.py")   # in aicg/semantics/
REPORTS = {"explain", "explore", "report"}


def _record(loaded: cli_graph.LoadedGraph):
    try:
        loaded.full()
    except (InputError, CompileError, cli_graph.GraphChanged) as err:
        return TaskFailed(str(err))
    return record_task.run_record(loaded.full)


def _explain(loaded: cli_graph.LoadedGraph):
    from .. import plan_inputs, suggest
    from ..dtypes import DTYPES
    from ..semantics import explain, legality
    try:
        instance = loaded.full()
    except (InputError, CompileError, cli_graph.GraphChanged) as err:
        return TaskFailed(str(err))
    rules, prof = instance.ruleset, instance.profile
    op_names = [get_var("op")] if get_var("op") else list(prof.workload)
    for name in op_names:
        if name not in rules.ops:
            return TaskFailed(_hinted(f"op={name}: expected an operator of the atlas (one of: {', '.join(rules.ops)})",
                                      suggest.did_you_mean(name, rules.ops)))
    manifest_path = instance.env.instance_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    kernels, synthesis = manifest.get("kernels", {}), manifest.get("synthesis", {})
    for name in op_names:
        in_workload = prof.workload[name].dtypes if name in prof.workload else ("float32",)
        dtypes = [get_var("dtype")] if get_var("dtype") else list(in_workload)
        for dtype in dtypes:
            if dtype not in DTYPES or dtype not in prof.preservation.tolerance:
                known = [d for d in DTYPES if d in prof.preservation.tolerance]
                return TaskFailed(_hinted(f"dtype={dtype}: expected one of {', '.join(known)}",
                                          suggest.did_you_mean(dtype, known)))
        decided = legality.decide_all(name, dtypes, rules, prof.preservation, prof.choice)
        chosen = {d: kernels.get(f"{name}.{d}") for d in dtypes}
        trajectories = {d: synthesis.get(f"{name}.{d}") for d in dtypes}
        print(explain.explain(decided, rules, prof.preservation, chosen, trajectories), end="")
        for r in instance.rejected.get(name, []):
            if r["dtype"] in dtypes:
                print("  " + _rejection_text(r))
        families = ", ".join(f.name for f in rules.families_of(name))
        print(f"  plan inputs of {instance.hardware.target} (read by the prior of {families}):")
        print("\n".join(plan_inputs.describe(instance.plan_inputs)) + "\n")


def _hinted(message: str, hint: str) -> str:
    return f"{message}. {hint}" if hint else message


def _rejection_text(r: dict) -> str:
    if r["by"] == "measured drift":
        return (f"rejected by measured drift: {r['rule']} in {r['family']} ({r['dtype']}): every realisation "
                f"drifts beyond rtol {r['bound']:g}; the least, {r['drift']:.3g} at row length {r['cols']} "
                f"({r['source']})")
    return (f"rejected by its rounding bound: {r['rule']} in {r['family']} ({r['dtype']}): every realisation's order "
            f"keeps rtol {r['bound']:g} only on rows of at most {r['longest_row']} elements, and the workload's "
            f"shortest rows have {r['cols']} ({r['source']})")


def _explore(loaded: cli_graph.LoadedGraph):
    from ..semantics import explore
    try:
        rules = loaded.full().ruleset
    except (InputError, CompileError, cli_graph.GraphChanged) as err:
        return TaskFailed(str(err))
    cas.write_atomic(Path(EXPLORER), explore.page(rules).encode())
    print(f"wrote {EXPLORER}")


class BuildReporter(ConsoleReporter):
    """Prints each task that runs (on a terminal: a bar of tasks done, elapsed and left
    instead), then counts, then the instance summary."""

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.origins: dict[str, list[str]] = {"ran": [], "local": [], "remote": [], "record": []}
        self.fresh: list[str] = []
        self.bar = cli_progress.Bar(0, "aicg", stream=outstream)

    def initialize(self, tasks, selected_tasks):
        instance = _loaded.get("instance")
        if instance is not None:   # before any step is checked or run: one build of it at a time here
            build_lock.hold(instance.env.instance_dir.parent, instance.name, self._say_now)
        self.bar = cli_progress.Bar(len(_to_process(tasks, selected_tasks)), "aicg", stream=self.outstream)

    def _say_now(self, text: str) -> None:
        self.write(text)
        self.outstream.flush()

    def execute_task(self, task):
        if not task.actions or task.name in REPORTS:
            return
        if self.bar.drawn:
            self.bar.show(task.name)
            if task.verbosity == 2:   # it prints as it goes: the bar comes back when it is done
                self.bar.clear()
        else:
            self.write(f". {task.name}\n")
            self.outstream.flush()

    def _done(self, task) -> None:
        if task.actions:
            self.bar.advance()

    def add_failure(self, task, fail):
        self._done(task)
        super().add_failure(task, fail)

    def skip_ignore(self, task):
        self._done(task)

    @staticmethod
    def _is_step(task) -> bool:
        """A step of the instance (probes measure the node; reports print): only steps are counted."""
        return bool(task.actions) and task.name not in REPORTS and task.name.split(":")[0] not in ("probe", "primitives")

    def add_success(self, task):
        self._done(task)
        if self._is_step(task):
            self.origins[task.values.get("origin", "ran")].append(task.name)
        loaded = _loaded.get("instance")
        if loaded is not None and task.values.get("store"):
            loaded.env.store.stats.update(task.values["store"])

    def skip_uptodate(self, task):
        self._done(task)
        if self._is_step(task):
            self.fresh.append(task.name)

    def write(self, text):
        if self.bar.drawn:
            self.bar.write(text)
        else:
            super().write(text)

    def _write_failure(self, result, write_exception=True):
        self.write(f"FAILED {result['task'].name}: {result['exception'].get_msg().strip()}\n")

    def complete_run(self):
        try:
            nvrtc.finish_ahead()
            self._complete_run()
        finally:
            build_lock.release()   # after the summary and provenance: the next build here may start

    def _complete_run(self):
        self.bar.close()
        if self.runtime_errors:
            self.write("Execution aborted.\n" + "\n".join(self.runtime_errors) + "\n")
        ran, local, remote, recorded = (self.origins[o] for o in ("ran", "local", "remote", "record"))
        if not (ran or local or remote or recorded or self.failures or self.fresh):
            return
        if not (ran or local or remote or recorded or self.failures):
            self.write(f"aicg: nothing to do, all {len(self.fresh)} tasks are up to date, in {self.bar.elapsed():.2f} s\n")
        else:
            compiled = sum(1 for n in ran if n.startswith("compile:"))   # a kernel may take two NVRTC runs (occupancy.py)
            self.write(f"aicg: {len(ran)} tasks ran ({compiled} kernels compiled), "
                       f"{len(local) + len(remote)} restored from cache ({len(local)} local, {len(remote)} remote), "
                       + (f"{len(recorded)} validations from the record, " if recorded else "")
                       + f"{len(self.fresh)} up to date, in {self.bar.elapsed():.1f} s\n")
        instance = _loaded.get("instance")
        if instance is None:
            return
        _record_build(instance, changed=bool(ran or local or remote or recorded or self.failures))
        processed = set(ran) | set(local) | set(remote) | set(recorded) | set(self.fresh)
        if "package" in processed and not self.failures:
            manifest_path = instance.env.instance_dir / "manifest.json"
            self.write(f"\ninstance {instance.name} -> {manifest_path.parent}\n")
            self.write(summary.table(json.loads(manifest_path.read_text())))
            if "report" not in processed:
                self.write(f"`doit report` writes {manifest_path.parent / 'report.html'}: times, candidates, plots.\n")


def _to_process(tasks: dict, selected: list[str]) -> set[str]:
    """The tasks with actions that running `selected` goes through: they and what they depend on."""
    seen: set[str] = set()
    todo = list(selected)
    while todo:
        name = todo.pop()
        if name in seen or name not in tasks:
            continue
        seen.add(name)
        task = tasks[name]
        todo += list(task.task_dep) + list(task.setup_tasks)
    return {n for n in seen if tasks[n].actions}


def _record_build(instance: cli_graph.LoadedGraph, changed: bool = True) -> None:
    """Where each artifact came from (provenance.json beside the manifest, which
    stays bit-identical whatever its origin) and the store's counters; a build that
    changed nothing leaves the provenance a build wrote."""
    env = instance.env
    if not changed and (env.instance_dir / "provenance.json").exists() and not env.store.stats:
        return
    origins = {s.name: (env.receipt(s.name) or {}).get("origin") for s in instance.steps}
    if any(origins.values()):
        cas.write_atomic(env.instance_dir / "provenance.json",
                         (json.dumps({"origins": origins}, indent=1, sort_keys=True) + "\n").encode(), env.tmp)
    if env.store.stats:
        env.store.write_build_stats(instance.name)


DOIT_CONFIG = {
    "default_tasks": ["build"],
    "reporter": BuildReporter,
    "dep_file": ".doit.db",
    "backend": "sqlite3",   # safe for two builds at once in one checkout
}
