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

A step writes only the outputs it declares (`targets` and `optional_outputs`),
whatever a store entry names. Evidence (a validation) taken from an unsigned
remote is published with `trusted: false` in its receipt, and the key of every
step reading it says so, so that a verdict drawn from it is never confused
with one drawn from trusted evidence (aicg/trust.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import cas, digest, trust
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
    optional_outputs: tuple[str, ...] = ()  # outputs a result may hold besides its targets
    role: str = "content"          # "content", "evidence" or "verdict": what a stored result is taken for (trust.py)
    signed: tuple[str, ...] = ()   # outputs signed beside them (<path>.sig) when a signing key is configured
    # a compile step's programs, computable before its upstream steps run: () -> (the upstream outputs'
    # digests the step will read, [(source, source_name, headers, arch), ...]) (aicg/nvrtc.compile_ahead)
    ahead: Callable[[], tuple[dict, list[tuple]]] | None = field(default=None, compare=False)

    @property
    def kind(self) -> str:
        return self.name.split(":", 1)[0]

    @property
    def declared(self) -> frozenset[str]:
        return frozenset(self.targets) | frozenset(self.optional_outputs)


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
    upstream, untrusted = {}, []
    for name in step.upstream:
        receipt = env.receipt(name)
        if receipt is None:
            return None
        upstream[name] = receipt["outputs"]
        if receipt.get("trusted") is False:
            untrusted.append(name)
    return key_given(step, env, upstream, untrusted)


def key_given(step: Step, env: Env, upstream: dict[str, dict], untrusted: list[str] = ()) -> str:
    """The step's key were its upstream steps to publish these outputs ({step name: {path: digest}})."""
    value = {"kind": step.kind, "code": code_digest(step.code), "reads": env.reads_digest(step), "upstream": upstream}
    if untrusted:   # only then: a build on trusted evidence keeps the keys it always had
        value["untrusted_upstream"] = list(untrusted)
    return digest.of_value(value)


def is_fresh(step: Step, env: Env) -> bool:
    if env.store.config.recache:   # the user asked for every step to run again
        return False
    receipt = env.receipt(step.name)
    if receipt is None or receipt["key"] != key(step, env):
        return False
    if step.local_state is not None and receipt.get("state") != step.local_state():
        return False
    if step.role == "evidence" and "trusted" not in receipt:
        return False
    # what this machine made but could not vouch for (a validation without a GPU) gives way to what has
    # since arrived under the same key: a GPU node's record pulled in, its cache copied or shared
    if receipt.get("origin") == "ran-uncached" and _usable_hit(step, env, receipt["key"]) is not None:
        return False
    for relpath, blob_digest in receipt["outputs"].items():
        if relpath not in step.declared:
            return False
        path = env.instance_dir / relpath
        if not path.is_file() or digest.of_file(path) != blob_digest:
            return False
    key_now = env.store.config.signing_key
    if key_now is not None:
        for relpath in step.signed:
            path = env.instance_dir / relpath
            if not path.is_file() or not trust.signed_by(path, path.read_bytes(), key_now):
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

    def trusted(self, step_name: str) -> bool:
        """Whether an upstream step's result is trusted evidence (False: from an unsigned remote)."""
        return (self.env.receipt(step_name) or {}).get("trusted", True)


def _publish(step: Step, env: Env, step_key: str, outputs: dict[str, bytes], origin: str, trusted: bool) -> None:
    for relpath, data in outputs.items():
        cas.write_atomic(env.instance_dir / relpath, data, env.tmp)
    receipt = {"key": step_key, "origin": origin,
               "outputs": {p: digest.of_bytes(d) for p, d in outputs.items()}}
    if step.role == "evidence":
        receipt["trusted"] = trusted
    if step.local_state is not None:
        receipt["state"] = step.local_state()
    for relpath in step.signed:
        if relpath in outputs:
            trust.write_signature(env.instance_dir / relpath, outputs[relpath], env.store.config.signing_key,
                                  lambda path, data: cas.write_atomic(path, data, env.tmp))
    env.write_receipt(step.name, receipt)


def _usable_hit(step: Step, env: Env, step_key: str):
    """The store's hit for the step, or None where there is none or it names outputs the step does not
    declare (a damaged or hostile entry: the step runs instead, and its result replaces the entry)."""
    hit = env.store.lookup(step_key, unsigned_ok=step.role != "verdict")
    if hit is None:
        return None
    bad = trust.undeclared_outputs(hit.outputs, step.declared)
    if bad:
        env.store.refuse(f"the stored result of {step.name} names outputs it does not declare ({', '.join(bad[:3])}); "
                         f"ignored, the step runs")
        return None
    return hit


def execute(step: Step, env: Env) -> str:
    """Restore or run the step and publish its outputs; returns where they came
    from: "local" or "remote" (a store hit) or "ran"."""
    step_key = key(step, env)
    if step_key is None:
        raise InputChanged(f"an upstream step of {step.name} has no published result")
    env.write_receipt(step.name, None)   # a failed run leaves the step stale

    hit = _usable_hit(step, env, step_key)
    if hit is not None:
        _publish(step, env, step_key, hit.outputs, hit.origin, hit.trusted)
        return hit.origin

    context = Context(step, env)
    result = step.run(context)
    if key(step, env) != step_key:
        raise InputChanged(f"an input of {step.name} changed while it ran; its result was not published")
    bad = trust.undeclared_outputs(result.outputs, step.declared)
    if bad:
        raise RuntimeError(f"{step.name} wrote outputs it does not declare: {', '.join(bad)}")
    if result.cache:
        env.store.record(step_key, step.kind, result.outputs)
    # evidence made here from untrusted evidence (a synthesis round after an unsigned one) stays untrusted
    trusted = all(context.trusted(name) for name in step.upstream)
    _publish(step, env, step_key, result.outputs, "ran" if result.cache else "ran-uncached", trusted)
    return "ran"


def clean(step: Step, env: Env) -> None:
    """Remove what the step published (doit clean); the store keeps its entries."""
    for relpath in step.declared:    # never a path a receipt names: only what the step may write
        (env.instance_dir / relpath).unlink(missing_ok=True)
    for relpath in step.signed:
        trust.signature_path(env.instance_dir / relpath).unlink(missing_ok=True)
    env.write_receipt(step.name, None)
