"""The validation record: what a GPU node validated, shipped in the repository.

A build on a GPU validates every candidate on the device; `doit build
record=1` there writes what it found to `hwdb/<target>.validations.jsonl`,
one line per instance and candidate: the validate step's key (which holds
the cubin's digest, the GPU's identity, the validation protocol and the
profile's settings), the GPU, its driver, the date, the verdict and the
step's output itself. A build anywhere reads the record as a read-only layer
under the local store: a machine with no GPU then gets the validations and
timings the GPU made, so the same picks and the same manifest bytes.

Nothing in it is taken on faith beyond what the repository itself is: a
line is used only under its exact key (a changed kernel, GPU, protocol or
setting is a miss), only if its output matches the digest it was recorded
with, and, where a signing key is configured, only if it carries that key's
signature. A line that fails any check is ignored, never an error.
"""
from __future__ import annotations

import datetime
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import cas, digest, trust

SUFFIX = ".validations.jsonl"
EVIDENCE_KIND = "validate"


def path_for(hwdb_dir: Path, target: str) -> Path:
    return Path(hwdb_dir) / f"{target}{SUFFIX}"


def _signed_part(line: dict) -> bytes:
    return digest.pack({k: v for k, v in line.items() if k != "signature"})


def _output_bytes(value) -> bytes:
    """The bytes a validate step publishes for its JSON value (aicg/tasks/graph.py's to_json)."""
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


@dataclass
class Record:
    """The lines of one record file, usable by key."""
    path: Path
    signing_key: bytes | None = None
    _by_key: dict | None = field(default=None, repr=False)

    def _load(self) -> dict:
        if self._by_key is None:
            self._by_key = {}
            try:
                text = self.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = ""
            for raw in text.splitlines():
                line = _parse(raw, self.signing_key)
                if line is not None:
                    self._by_key.setdefault(line["key"], line)
        return self._by_key

    def lookup(self, key: str) -> dict[str, bytes] | None:
        line = self._load().get(key)
        if line is None:
            return None
        return {relpath: _output_bytes(value) for relpath, value in line["outputs"].items()}

    def __len__(self) -> int:
        return len(self._load())


def _parse(raw: str, signing_key: bytes | None) -> dict | None:
    """A record line, or None where it is malformed, altered since it was recorded, or unsigned under a key."""
    try:
        line = json.loads(raw)
        outputs = line["outputs"]
        ok = (isinstance(line["key"], str) and isinstance(outputs, dict) and outputs
              and all(trust.safe_relpath(p) for p in outputs)
              and digest.of_value({p: digest.of_bytes(_output_bytes(v)) for p, v in outputs.items()}) == line["digest"])
    except (ValueError, KeyError, TypeError):
        return None
    if not ok:
        return None
    if signing_key is not None and not trust.verify(_signed_part(line), signing_key, line.get("signature")):
        return None
    return line


def driver_version() -> str:
    """The NVIDIA driver's version as nvidia-smi reports it ("unknown" where it cannot be asked)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def line_for(instance: str, step_name: str, step_key: str, outputs: dict[str, bytes], cubin_digest: str,
             driver: str, date: str, protocol: int, signing_key: bytes | None) -> dict:
    values = {relpath: json.loads(data) for relpath, data in outputs.items()}
    verdict = next(iter(values.values()))
    timings = verdict.get("timings") or []
    line = {"instance": instance, "step": step_name, "key": step_key, "gpu": verdict.get("device"), "driver": driver,
            "date": date, "protocol": protocol, "cubin": cubin_digest, "status": verdict.get("status"),
            "seconds": [t["median_seconds"] for t in timings],
            "digest": digest.of_value({p: digest.of_bytes(_output_bytes(v)) for p, v in values.items()}),
            "outputs": values}
    if any(_output_bytes(v) != outputs[p] for p, v in values.items()):
        raise ValueError(f"{step_name}: its output does not survive a JSON round trip; it cannot be recorded")
    if signing_key is not None:
        line["signature"] = trust.signature(_signed_part(line), signing_key)
    return line


def write(path: Path, instance: str, lines: list[dict]) -> tuple[int, int]:
    """Replace `instance`'s lines in the record at `path` by `lines`; other instances' lines stay.
    Returns (lines written for the instance, lines in the file)."""
    kept = []
    try:
        for raw in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(raw).get("instance") != instance:
                    kept.append(raw)
            except (ValueError, AttributeError):
                continue   # a damaged line is dropped on rewrite
    except FileNotFoundError:
        pass
    fresh = [json.dumps(line, sort_keys=True, separators=(",", ":")) for line in lines]
    every = sorted(kept + fresh, key=lambda raw: (json.loads(raw)["instance"], json.loads(raw)["step"]))
    cas.write_atomic(Path(path), ("\n".join(every) + "\n").encode() if every else b"")
    return len(fresh), len(every)


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()
