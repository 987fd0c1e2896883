"""`doit record`: build the instance, then write what its GPU validated to the target's record.

    doit record [profile=...] [target=...]

Run on a GPU node of the instance's target: every candidate the build
validated there (or took from the record already) becomes one line of
`hwdb/<target>.validations.jsonl` (aicg/record.py), replacing the lines this
instance had. A candidate validated nowhere, or only by an unsigned remote,
is not recorded; if nothing at all was validated, the task fails and says why.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from doit.exceptions import TaskFailed

from .. import record

if TYPE_CHECKING:
    from .graph import Instance

# where a trusted validation may come from ("remote" hits are trusted evidence only when signed;
# "ran-uncached": ran here without a verdict, such as on a machine with no GPU)
TRUSTED_ORIGINS = ("ran", "ran-uncached", "local", "remote", "record")


def lines_of(instance: Instance, driver: str, date: str) -> tuple[list[dict], list[str]]:
    """(record lines, steps left out with the reason) for the instance's validations."""
    from .graph import VALIDATION_PROTOCOL
    env, key = instance.env, instance.env.store.config.signing_key
    recorded = {line["key"]: line for layer in env.store.records for line in layer._load().values()}
    lines, left_out = [], []
    for step in instance.steps:
        if step.kind != record.EVIDENCE_KIND:
            continue
        receipt = env.receipt(step.name)
        if receipt is None:
            left_out.append(f"{step.name}: not built")
            continue
        if receipt.get("trusted") is False or receipt.get("origin") not in TRUSTED_ORIGINS:
            left_out.append(f"{step.name}: its validation is not trusted evidence ({receipt.get('origin')})")
            continue
        if receipt.get("origin") == "record" and receipt["key"] in recorded:
            lines.append(recorded[receipt["key"]])   # as recorded: its GPU's date and driver
            continue
        outputs = {relpath: (env.instance_dir / relpath).read_bytes() for relpath in receipt["outputs"]}
        verdict = json.loads(next(iter(outputs.values())))
        if verdict.get("status") not in ("passed", "failed"):
            left_out.append(f"{step.name}: {verdict.get('status')} here ({verdict.get('reason')})")
            continue
        compile_receipt = env.receipt(step.upstream[0]) or {"outputs": {}}
        cubin = next((d for p, d in compile_receipt["outputs"].items() if p.endswith(".cubin")), None)
        lines.append(record.line_for(instance.name, step.name, receipt["key"], outputs, cubin, driver, date,
                                     VALIDATION_PROTOCOL, key))
    return lines, left_out


def _own_record(layout, target: str) -> Path:
    """Where the record is written: this directory's hwdb/ (aicg/cli_layout.py), which starts
    from the record read so far (the shipped one) where it has none of its own."""
    read = record.path_for(layout.hwdb, target)
    own = record.path_for(getattr(layout, "own_hwdb", layout.hwdb), target)
    if own != read and not own.exists() and read.exists():
        own.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(read, own)
    return own


def run_record(instance_loader) -> dict | TaskFailed:
    instance = instance_loader()
    lines, left_out = lines_of(instance, record.driver_version(), record.today())
    path = _own_record(instance.layout, instance.hardware.target)
    if not lines:
        why = "; ".join(left_out[:2]) + (f"; and {len(left_out) - 2} more" if len(left_out) > 2 else "")
        return TaskFailed(f"nothing to record for {instance.name}: no candidate was validated on "
                          f"{instance.hardware.name} ({why}); run `doit record` on a GPU node of the target")
    written, total = record.write(path, instance.name, lines)
    size = path.stat().st_size
    print(f"recorded {written} validations of {instance.name} on {instance.hardware.name} in {path} "
          f"({total} lines, {size} bytes)" + (f"; {len(left_out)} left out" if left_out else ""))
    for why in left_out:
        print(f"  left out: {why}")
    return {"record": str(path), "lines": written, "bytes": size}
