"""A step of the build: a keyed, cached unit of work with published outputs.

A step's key is xxh3-128 over the canonical encoding of: its kind, the
source of the code that implements it, the values it reads (not whole
files), and the digests of the upstream outputs it consumes. The key is
computed before the step runs. On an action-cache hit the outputs are
restored from the store and nothing runs; on a miss the step runs, its key is
computed again, and only if nothing moved meanwhile are its outputs put in
the store and published.

Each published step leaves a receipt in `<instance>/.receipts/`: its key,
where the outputs came from, and their digests. A step is fresh when its
receipt's key equals the key computed now and every output on disk still has
the recorded digest; `touch` changes no digest, so it changes nothing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import cas, digest
from ..errors import InputChanged
from ..store import LayeredStore

AICG_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Result:
    outputs: dict[str, bytes]     # path inside the instance -> content
    cache: bool = True            # False for results that are not facts (e.g. "not validated here")


@dataclass(frozen=True)
class Step:
    name: str                     # doit task name, "<kind>:<subject>"
    doc: str
    reads: object                 # every value the step reads besides upstream outputs
    run: Callable[["Context"], Result]
    code: tuple[str, ...]         # aicg modules (relative paths) whose source shapes the result
    upstream: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()  # outputs known before running (doit targets)
    local_state: Callable[[], object] | None = field(default=None, compare=False)

    @property
    def kind(self) -> str:
        return self.name.split(":", 1)[0]


@dataclass
class Env:
    """Where one instance's steps publish, and the store they share.

    Receipts are read once per load and then kept in memory: a build reads
    each upstream receipt from every downstream step, and this process is
    the only writer during a build.
    """
    instance_dir: Path
    store: LayeredStore
    _receipts: dict = field(default_factory=dict, repr=False)
    _reads: dict = field(default_factory=dict, repr=False)

    @property
    def tmp(self) -> Path:
        """Temporary files of atomic writes: outside the instance proper."""
        return self.instance_dir / ".tmp"

    def receipt_path(self, step_name: str) -> Path:
        return self.instance_dir / ".receipts" / (step_name.replace(":", ".") + ".msgpack")

    def receipt(self, step_name: str) -> dict | None:
        if step_name not in self._receipts:
            try:
                self._receipts[step_name] = digest.unpack(self.receipt_path(step_name).read_bytes())
            except Exception:  # missing or unreadable receipts mean "not built"
                return None
        return self._receipts[step_name]

    def write_receipt(self, step_name: str, receipt: dict | None) -> None:
        self._receipts.pop(step_name, None)
        if receipt is None:
            self.receipt_path(step_name).unlink(missing_ok=True)
        else:
            cas.write_atomic(self.receipt_path(step_name), digest.pack(receipt), self.tmp)
            self._receipts[step_name] = receipt

    def reads_digest(self, step: "Step") -> str:
        if step.name not in self._reads:
            self._reads[step.name] = digest.of_value(step.reads)
        return self._reads[step.name]


@functools.cache
def code_digest(modules: tuple[str, ...]) -> str:
    return digest.of_value({m: digest.of_file(AICG_DIR / m) for m in modules})


def key(step: Step, env: Env) -> str | None:
    """The step's key now, or None when an upstream step has not published."""
    upstream = {}
    for name in step.upstream:
        receipt = env.receipt(name)
        if receipt is None:
            return None
        upstream[name] = receipt["outputs"]
    return digest.of_value({"kind": step.kind, "code": code_digest(step.code),
                            "reads": env.reads_digest(step), "upstream": upstream})


def is_fresh(step: Step, env: Env) -> bool:
    if env.store.config.recache:   # the user asked for every step to run again
        return False
    receipt = env.receipt(step.name)
    if receipt is None or receipt["key"] != key(step, env):
        return False
    if step.local_state is not None and receipt.get("state") != step.local_state():
        return False
    for relpath, blob_digest in receipt["outputs"].items():
        path = env.instance_dir / relpath
        if not path.is_file() or digest.of_file(path) != blob_digest:
            return False
    return True


class Context:
    """What a running step may read: upstream outputs, each checked against its receipt."""

    def __init__(self, step: Step, env: Env):
        self.step, self.env = step, env

    def upstream(self, step_name: str, relpath: str) -> bytes:
        if step_name not in self.step.upstream:
            raise KeyError(f"{self.step.name} reads {step_name}, which is not among its upstream steps")
        receipt = self.env.receipt(step_name)
        data = (self.env.instance_dir / relpath).read_bytes()
        if receipt is None or receipt["outputs"].get(relpath) != digest.of_bytes(data):
            raise InputChanged(f"{relpath} (from {step_name}) changed while {self.step.name} ran")
        return data


def _publish(step: Step, env: Env, step_key: str, outputs: dict[str, bytes], origin: str) -> None:
    for relpath, data in outputs.items():
        cas.write_atomic(env.instance_dir / relpath, data, env.tmp)
    receipt = {"key": step_key, "origin": origin,
               "outputs": {p: digest.of_bytes(d) for p, d in outputs.items()}}
    if step.local_state is not None:
        receipt["state"] = step.local_state()
    env.write_receipt(step.name, receipt)


def execute(step: Step, env: Env) -> str:
    """Restore or run the step and publish its outputs; returns where they came
    from: "local" or "remote" (a store hit) or "ran"."""
    step_key = key(step, env)
    if step_key is None:
        raise InputChanged(f"an upstream step of {step.name} has no published result")
    env.write_receipt(step.name, None)   # a failed run leaves the step stale

    hit = env.store.lookup(step_key)
    if hit is not None:
        outputs, origin = hit
        _publish(step, env, step_key, outputs, origin)
        return origin

    result = step.run(Context(step, env))
    if key(step, env) != step_key:
        raise InputChanged(f"an input of {step.name} changed while it ran; its result was not published")
    if result.cache:
        env.store.record(step_key, step.kind, result.outputs)
    _publish(step, env, step_key, result.outputs, "ran" if result.cache else "ran-uncached")
    return "ran"


def clean(step: Step, env: Env) -> None:
    """Remove what the step published (doit clean); the store keeps its entries."""
    receipt = env.receipt(step.name)
    for relpath in (receipt or {}).get("outputs", {}):
        (env.instance_dir / relpath).unlink(missing_ok=True)
    for relpath in step.targets:
        (env.instance_dir / relpath).unlink(missing_ok=True)
    env.write_receipt(step.name, None)
