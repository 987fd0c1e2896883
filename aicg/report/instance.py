"""What the report reads of a built instance, each file checked against the step that wrote it.

An instance directory holds every step's outputs and, in `.receipts/`, the digest each was
published with (aicg/tasks/step.py). The report reads a file there when it still has that
digest; a file missing or changed since is read from the store by its digest instead, and where
neither has it the report says which step to run again. A directory without receipts (an
instance copied without its bookkeeping) is read as it is.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .. import cas, digest
from ..errors import InputError


@dataclass
class Files:
    root: Path
    store: cas.Store | None = None

    def _receipt(self, step: str) -> dict | None:
        path = self.root / ".receipts" / (step.replace(":", ".") + ".msgpack")
        try:
            return digest.unpack(path.read_bytes())
        except Exception:   # no receipt: not built, or copied without its bookkeeping
            return None

    def read(self, step: str, relpath: str, required: bool = True) -> bytes | None:
        path = self.root / relpath
        receipt = self._receipt(step)
        expected = (receipt or {}).get("outputs", {}).get(relpath)
        data = path.read_bytes() if path.is_file() else None
        if expected is None:
            if data is None and required:
                raise InputError(path, "(file)", f"the output of step {step}: run `doit build` for this instance")
            return data
        if data is not None and digest.of_bytes(data) == expected:
            return data
        stored = self.store.get_blob(expected) if self.store is not None else None
        if stored is None and required:
            raise InputError(path, "(file)", f"the output of step {step} with digest {expected} (its receipt's); "
                                             f"it changed or is gone, and the store does not hold it: run `doit build`")
        return stored

    def json(self, step: str, relpath: str, required: bool = True):
        data = self.read(step, relpath, required)
        if data is None:
            return None
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise InputError(self.root / relpath, "(file)", "JSON as the build writes it", str(err)) from None


@dataclass
class Instance:
    root: Path
    manifest: dict
    selections: dict[str, dict]                     # op -> select/<op>.json
    validations: dict[str, dict]                    # candidate id -> validation/<id>.json
    facts: dict[str, dict]                          # the target's facts, as the hw step resolved them
    realisation: dict | None                        # the lab's profile the instance carries, if any
    notes: list[str] = field(default_factory=list)  # what could not be read, for the page to say

    @property
    def name(self) -> str:
        return self.manifest["instance"]

    @property
    def target(self) -> dict:
        return self.manifest["target"]

    def fact(self, name: str) -> dict | None:
        return self.facts.get(name)


def read(root: Path, store: cas.Store | None = None) -> Instance:
    files = Files(Path(root), store)
    manifest = files.json("package", "manifest.json")
    target = target_entry(manifest)
    hw = files.json(f"hw:{target}", f"hw/{target}.json")
    ops = sorted({k["op"] for k in manifest["kernels"].values()})
    selections = {op: files.json(f"select:{op}", f"select/{op}.json") for op in ops}
    validations, notes = {}, []
    for op, selection in selections.items():
        for pick in selection["dtypes"].values():
            for cand in pick["candidates"]:
                if cand["id"].startswith("synth:"):
                    continue   # a synthesis round's validation lives in its trajectory
                record = files.json(f"validate:{cand['id']}", f"validation/{cand['id']}.json", required=False)
                if record is None:
                    notes.append(f"validation/{cand['id']}.json is missing")
                else:
                    validations[cand["id"]] = record
    realisation = files.json("package", f"source/hwdb/{target}.realisation.json", required=False)
    return Instance(Path(root), manifest, selections, validations, hw["facts"], realisation, notes)


def target_entry(manifest: dict) -> str:
    """The hwdb entry the instance was built for: the hw step is named after it."""
    names = [n for n in manifest.get("inputs", {}) if n.startswith("hw:")]
    if len(names) != 1:
        raise InputError("manifest.json", "inputs", "exactly one hw:<target> step", names)
    return names[0].split(":", 1)[1]
