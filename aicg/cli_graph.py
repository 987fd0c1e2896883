"""An instance's task graph, kept between commands while nothing it was made from changes.

Loading an instance plans its whole workload (the legality engine, the cost prior over the
lab's measurements, a digest of the realisation profile): a second or more, on every command.
`doit list` and a build with nothing to do need only the graph: each step's name, doc,
upstream steps and outputs, and the digest of the values it reads. That is kept in
the local store's graphs/ (kept_path), one file per (profile, target) as given on the command line, and used while
the bytes of everything loading reads are those it was made from: aicg's own source, the rule
sets, hwdb, kernels, the profile; and the environment variables aicg reads, the toolchain and the Python that
run it. (target=auto depends on the GPU present: it is always loaded.)

A step from the kept graph that has to run loads the instance in full (once per process,
before doit forks its workers where it can) and runs the step as loaded, after checking that
it reads what the kept graph said. The file is msgpack, checked by its digest on read; a file
that fails the check is a miss.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import cas, config, digest, nvrtc
from .tasks import step as steps

SCHEMA = 1
GRAPHS = "graphs"
AICG_DIR = Path(__file__).resolve().parent
AUTO = "auto"
# what else shapes the graph's values besides aicg's source: these packages' versions
PACKAGES = ("numpy", "msgpack", "xxhash", "doit")
DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg")


@dataclass
class Env(steps.Env):
    """steps.Env whose receipts are read again once their file changes (a doit worker process
    writes them while the parent checks the next steps), and whose steps' read digests may come
    from a kept graph (its steps carry no values)."""
    read_digests: dict = field(default_factory=dict, repr=False)
    _stamps: dict = field(default_factory=dict, repr=False)

    def receipt(self, step_name: str) -> dict | None:
        try:
            stat = os.stat(self.receipt_path(step_name))
            stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except OSError:
            stamp = None
        if self._stamps.get(step_name, stamp) != stamp:
            self._receipts.pop(step_name, None)
        self._stamps[step_name] = stamp
        return super().receipt(step_name)

    def reads_digest(self, step: steps.Step) -> str:
        kept = self.read_digests.get(step.name)
        return kept if kept is not None else super().reads_digest(step)


def no_gpu_here() -> bool:
    """Whether this is a Linux machine with no NVIDIA device node (nor WSL's), where the CUDA
    driver can find no GPU: known without loading the driver."""
    return sys.platform == "linux" and not any(os.path.exists(p) for p in DEVICE_NODES)


@functools.cache
def device_state():
    """aicg.validate.local_device_state, once per command (None where no_gpu_here())."""
    if no_gpu_here():
        return None
    from .validate import local_device_state
    return local_device_state()


class GraphChanged(RuntimeError):
    """The instance loaded in full is not the graph that was kept: its file is removed."""


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not on Linux
        return max(1, os.cpu_count() or 1)


class LoadedGraph:
    """What the tasks and the reporter read of an instance: name, env, layout and steps, with the
    instance in full behind it, loaded at first need (any other attribute is the instance's)."""

    def __init__(self, name: str, env: Env, layout, steps_: list[steps.Step], target: str, notes: list[str],
                 load_full, instance=None, kept: Path | None = None):
        self.name, self.env, self.layout, self.steps, self.target, self.notes = name, env, layout, steps_, target, notes
        self._load_full, self._instance, self._kept = load_full, instance, kept
        self._full_steps: dict[str, steps.Step] | None = None
        self._failed: Exception | None = None
        self.compiled_ahead = False   # compile_ahead has run for this build

    @property
    def from_kept_graph(self) -> bool:
        return self._kept is not None

    def full(self):
        """The instance as aicg.tasks.graph.load_instance gives it."""
        if self._failed is not None:
            raise self._failed
        if self._instance is None:
            try:
                instance = self._load_full()
            except Exception as err:   # said once per step that needs it, loaded once
                self._failed = err
                raise
            if [s.name for s in instance.steps] != [s.name for s in self.steps]:
                self.forget()
                self._failed = GraphChanged("the instance's steps are not those of its kept graph, which is "
                                            "removed; run the command again")
                raise self._failed
            self._instance = instance
        return self._instance

    def compile_ahead(self) -> int:
        """Start compiling, on threads, every kernel of the instance that no step has published and
        neither the local store nor a record holds (aicg/nvrtc.compile_ahead), for a build that runs
        its steps one at a time (on a GPU node): the compile steps then take what is ready while the
        validations use the GPU. Returns how many programs it started."""
        programs = []
        for s in self.full().steps:
            if s.ahead is None or self.is_fresh(s):
                continue
            upstream, made = s.ahead()
            if not self.env.store.holds_here(steps.key_given(s, self.env, upstream)):
                programs += made
        return nvrtc.compile_ahead(programs, workers=max(1, cores() - 2)) if len(programs) > 1 else 0

    def step(self, name: str) -> steps.Step:
        """The step `name` as loaded in full, checked to read what the kept graph said."""
        if self._full_steps is None:
            self._full_steps = {s.name: s for s in self.full().steps}
        found = self._full_steps[name]
        if self._kept is not None and digest.of_value(found.reads) != self.env.read_digests.get(name):
            self.forget()
            raise GraphChanged(f"{name} reads other values than its kept graph said; the kept graph is "
                               f"removed, run the command again")
        return found

    def forget(self) -> None:
        if self._kept is not None:
            self._kept.unlink(missing_ok=True)

    def is_fresh(self, step: steps.Step) -> bool:
        fresh = steps.is_fresh(step, self.env)
        if not fresh and self._kept is not None:
            try:
                self.full()   # here, before doit forks the workers that run it
            except Exception:   # the step's action loads it again, and fails saying why
                pass
        return fresh

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.full(), attr)


class Stamps:
    """File digests by (size, mtime, inode), as the kept graph recorded them: a file whose stat is
    unchanged is not read again (a file changed within RACY seconds of the recording is, as git
    treats its index)."""
    RACY_NS = 2_000_000_000

    def __init__(self, recorded: dict | None = None, written_ns: int = 0):
        self.recorded, self.written_ns = recorded or {}, written_ns
        self.now: dict[str, list] = {}

    def digest(self, label: str, path: Path) -> str:
        stat = os.stat(path)
        stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        seen = self.recorded.get(label)
        if seen is not None and seen[:3] == stamp and stat.st_mtime_ns + self.RACY_NS < self.written_ns:
            found = seen[3]
        else:
            found = digest.of_file(path)
        self.now[label] = [*stamp, found]
        return found


def _file_digests(directory: Path, label: str, into: dict, stamps: Stamps) -> None:
    for path in sorted(Path(directory).rglob("*")):
        if "__pycache__" not in path.parts and path.is_file():
            name = f"{label}/{path.relative_to(directory).as_posix()}"
            into[name] = stamps.digest(name, path)


def inputs_digest(layout, profile: Path, target: str | None, stamps: Stamps) -> str | None:
    """The digest of everything loading the graph reads; None where a file cannot be read (the
    instance is then loaded in full, whose loaders say what is wrong with it)."""
    try:
        return _inputs_digest(layout, profile, target, stamps)
    except OSError:
        return None


def _inputs_digest(layout, profile: Path, target: str | None, stamps: Stamps) -> str:
    from importlib import metadata

    from . import toolchain
    files: dict[str, str] = {}
    for label, directory in (("aicg", AICG_DIR), ("rulesets", layout.rules), ("hwdb", layout.hwdb),
                             ("kernels", layout.kernels)):
        _file_digests(directory, label, files, stamps)
    files["profile"] = stamps.digest("profile", profile)
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return digest.of_value({
        "schema": SCHEMA, "files": files, "root": str(layout.root), "layout": [str(layout.rules), str(layout.hwdb),
                                                                               str(layout.kernels)],
        "profile": str(profile), "target": target, "toolchain": toolchain.identity(), "packages": versions,
        "environment": {k: os.environ[k] for k in config.VARIABLES if k in os.environ},
        "python": [sys.version, sys.platform, sys.byteorder]})


def kept_path(root: Path, profile: Path, target: str | None) -> Path:
    """Where the graph of `profile` for `target` in the project at `root` is kept: in the local
    store's directory (as the environment and pyproject.toml place it; a profile's own [cache]
    table is read only with the profile), beside its objects and actions, which it is not."""
    local = config.load(Path(root)).local
    return local / GRAPHS / f"{digest.of_value([str(root), str(profile), target])[:32]}.msgpack"


def _read(path: Path) -> dict | None:
    try:
        wrapper = digest.unpack(path.read_bytes())
        body = wrapper["body"]
        if digest.of_bytes(body) != wrapper["digest"]:
            return None
        table = digest.unpack(body)
    except Exception:   # missing, unreadable or damaged: loaded in full, and written again
        return None
    return table if isinstance(table, dict) and table.get("schema") == SCHEMA else None


def _write(path: Path, table: dict) -> None:
    body = digest.pack(table)
    try:
        cas.write_atomic(path, digest.pack({"digest": digest.of_bytes(body), "body": body}))
    except OSError:
        pass   # a build directory that cannot be written loads the graph in full each time


def _table(instance, inputs: str, notes: list[str], reads: dict[str, str]) -> dict | None:
    """The graph of `instance` as kept, or None where a step checks a local state other than the
    device's (nothing else can be restored from a name)."""
    from .validate import local_device_state
    rows = []
    for s in instance.steps:
        if s.local_state not in (None, local_device_state):
            return None
        rows.append({"name": s.name, "doc": s.doc, "code": list(s.code), "reads": reads[s.name],
                     "upstream": list(s.upstream), "targets": list(s.targets), "optional": list(s.optional_outputs),
                     "role": s.role, "signed": list(s.signed), "device": s.local_state is not None})
    cache = instance.profile.cache
    return {"schema": SCHEMA, "inputs": inputs, "name": instance.name, "instance_dir": str(instance.env.instance_dir),
            "target": instance.hardware.target, "notes": notes,
            "cache": {"values": dict(cache), "origins": {k: list(v) for k, v in getattr(cache, "origins", {}).items()}},
            "record": str(instance.env.store.records[0].path) if instance.env.store.records else None,
            "steps": rows}


def _not_loaded(context):
    raise RuntimeError("a step of a kept graph runs as loaded in full (LoadedGraph.step)")


def _from_table(table: dict, layout, recache: bool, load_full, kept: Path) -> LoadedGraph:
    from .store import LayeredStore
    cache = config.Settings(table["cache"]["values"], {k: tuple(v) for k, v in table["cache"]["origins"].items()})
    store = LayeredStore(config.load(layout.root, cache, recache))
    if table["record"]:
        store.attach_record(Path(table["record"]))
    env = Env(Path(table["instance_dir"]), store, read_digests={r["name"]: r["reads"] for r in table["steps"]})
    light = [steps.Step(r["name"], r["doc"], None, _not_loaded, tuple(r["code"]), tuple(r["upstream"]),
                        tuple(r["targets"]), local_state=device_state if r["device"] else None,
                        optional_outputs=tuple(r["optional"]), role=r["role"], signed=tuple(r["signed"]))
             for r in table["steps"]]
    return LoadedGraph(table["name"], env, layout, light, table["target"], table["notes"], load_full, kept=kept)


def load(layout, profile: Path, target: str | None, recache: bool, notes_of) -> LoadedGraph:
    """The graph of the instance of `profile` for `target` (None: the profile's own), kept or
    loaded in full; notes_of(instance) -> what loading says of it (printed on every load)."""
    def load_full():
        from .tasks import graph
        return graph.load_instance(layout, profile, layout.root / "build", recache=recache, target=target)

    kept = kept_path(layout.root, profile, target)
    table = _read(kept) if target != AUTO else None
    stamps = Stamps(table.get("stamps"), table.get("written_ns", 0)) if table else Stamps()
    inputs = None if target == AUTO else inputs_digest(layout, profile, target, stamps)
    if table is not None and inputs is not None and table.get("inputs") == inputs:
        return _from_table(table, layout, recache, load_full, kept)
    instance = load_full()
    notes = notes_of(instance)
    env = Env(instance.env.instance_dir, instance.env.store)
    if inputs is not None:
        env.read_digests = {s.name: instance.env.reads_digest(s) for s in instance.steps}
        written = _table(instance, inputs, notes, env.read_digests)
        if written is not None:
            _write(kept, {**written, "stamps": stamps.now, "written_ns": time.time_ns()})
    return LoadedGraph(instance.name, env, layout, instance.steps, instance.hardware.target, notes, load_full,
                       instance=instance)
