"""Writing probe figures into hwdb/<gpu>.toml's measured section.

The datasheet part of an entry is written by people, with comments; the
measured section is written by `doit probe` and always comes last, after
MARKER. Merging keeps the head byte for byte and rewrites only the section.

A re-probe that lands within a figure's recorded spread keeps the recorded
figure unchanged (value and provenance), so an unchanged GPU leaves the file
and every task that reads it as they were; a figure that moved further is
replaced. Figures of probes that did not run this time are kept.

Curves go beside the entry in hwdb/<gpu>.curves.json, one object per probe.
"""
from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from .. import cas, hw, tomlfile
from ..errors import InputError
from . import registry
from .figures import Figure, ProbeResult

MARKER = "# Measured by `doit probe` (rewritten by it; edit the datasheet facts above this line)."
_SECTION_START = re.compile(r"^(?:" + re.escape(MARKER) + r"|\[measured[.\]])", re.M)


def figure_units() -> dict[str, str]:
    """Every figure a probe may write, with its unit."""
    return {name: unit for module in registry.all_probes() for name, unit in module.FIGURES.items()}


def slug(device_name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the file stem a new entry gets."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")


def _identity(path: Path) -> tuple[str, tuple[int, ...]] | None:
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise InputError(path, "(syntax)", "valid TOML", str(err)) from None
    identity = doc.get("identity", {})
    return identity.get("name"), tuple(identity.get("compute_capability", ()))


def entry_for(hwdb_dir: Path, device_name: str, compute_capability: tuple[int, int]) -> Path:
    """The entry whose identity is this device (name and compute capability), or the path a new one gets."""
    for path in sorted(Path(hwdb_dir).glob("*.toml")):
        if _identity(path) == (device_name, tuple(compute_capability)):
            return path
    return Path(hwdb_dir) / f"{slug(device_name)}.toml"


def writable_entry(hwdb_dir: Path, own_dir: Path, device_name: str, compute_capability: tuple[int, int]) -> Path:
    """The entry of this device to write measurements to, in `own_dir` (this directory's hwdb/): the
    one `hwdb_dir` (what commands here read: the shipped entries with this directory's over them)
    has for it, copied into `own_dir` first where only the shipped hwdb has it (its datasheet facts
    kept), else the path a new one gets there."""
    found = entry_for(hwdb_dir, device_name, compute_capability)
    own = Path(own_dir) / found.name
    if found.exists() and not own.exists():
        own.parent.mkdir(parents=True, exist_ok=True)
        own.write_bytes(found.read_bytes())
    return own


def _new_head(device_name: str, compute_capability: tuple[int, int]) -> str:
    major, minor = compute_capability
    return (f"# {device_name}: created by `doit probe`. Add the datasheet facts (hw.REQUIRED_FACTS), each with\n"
            "# its source, before building for it.\nschema = 1\n\n"
            f"[identity]\nname = {json.dumps(device_name)}\narch = \"sm_{major}{minor}\"\n"
            f"compute_capability = [{major}, {minor}]\n")


def _split(path: Path, text: str) -> tuple[str, dict]:
    """(the entry's head, its measured facts as records); errors name the file and key."""
    match = _SECTION_START.search(text)
    head, tail = (text[:match.start()], text[match.start():]) if match else (text, "")
    try:
        tail_doc = tomllib.loads(tail)
        tomllib.loads(head)
    except tomllib.TOMLDecodeError as err:
        raise InputError(path, "(syntax)", "valid TOML", str(err)) from None
    extra = sorted(set(tail_doc) - {"measured"})
    if extra:
        raise InputError(path, extra[0], "nothing after the measured section (it must come last)")
    measured = tomlfile.Table(path, tail_doc, "").table("measured", default={})
    units = figure_units()
    for name, table in measured.tables():
        fact = hw.read_measured_fact(table, name)      # a malformed recorded fact is an error, not overwritten
        if name in units and fact.unit != units[name]:
            raise table.error("unit", repr(units[name]), fact.unit)
    return head.rstrip("\n") + "\n", tail_doc.get("measured", {})


@dataclass
class MergeReport:
    path: Path
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)     # re-measured within the recorded spread

    @property
    def changed(self) -> bool:
        return bool(self.added or self.replaced)


def within_spread(old: dict, new: Figure) -> bool:
    if old.get("unit") != new.unit:
        return False
    band = max(float(old.get("spread", 0.0)), new.spread) * abs(float(old["value"]))
    return abs(new.value - float(old["value"])) <= band


def merge(path: Path, device_name: str, compute_capability: tuple[int, int], probe: str, result: ProbeResult,
          date: str, driver: str, clocks: str, new_head: str | None = None) -> MergeReport:
    """Merge one probe's figures into the entry at `path`; atomic. Where it does not exist yet it
    starts as `new_head` (aicg/probe/new_entry.py: the driver's facts), or with an identity alone."""
    path = Path(path)
    if path.exists():
        text = path.read_text(encoding="utf-8")
    else:
        text = new_head if new_head is not None else _new_head(device_name, compute_capability)
    head, measured = _split(path, text)
    report = MergeReport(path)
    for fig in result.figures:
        expected = hw.REQUIRED_FACTS.get(fig.name)
        if expected is not None and fig.unit != expected:
            raise InputError(path, f"measured.{fig.name}.unit", repr(expected), fig.unit)
        if not (isinstance(fig.value, (int, float)) and math.isfinite(fig.value) and fig.value > 0):
            # a probe that measured nothing must not write what the entry would then refuse to load
            raise InputError(path, f"measured.{fig.name}.value", f"a positive finite measurement from probe {probe}",
                             fig.value)
        old = measured.get(fig.name)
        if old is not None and within_spread(old, fig):
            report.kept.append(fig.name)
            continue
        (report.replaced if old is not None else report.added).append(fig.name)
        measured[fig.name] = {"value": fig.value, "unit": fig.unit, "probe": probe, "date": date, "driver": driver,
                              "clocks": clocks, "method": fig.method, "repetitions": fig.repetitions,
                              "spread": fig.spread}
    if report.changed or not path.exists():
        section = tomli_w.dumps({"measured": dict(sorted(measured.items()))})
        new_text = f"{head}\n{MARKER}\n{section}"
        _split(path, new_text)        # what is written must read back
        cas.write_atomic(path, new_text.encode())
    return report


def write_curves(path: Path, probe: str, result: ProbeResult, date: str, clocks: str) -> Path:
    """hwdb/<gpu>.curves.json: this probe's curves and notes replace its previous ones."""
    curves_path = Path(path).with_suffix(".curves.json")
    data = json.loads(curves_path.read_text()) if curves_path.exists() else {}
    data[probe] = {"date": date, "clocks": clocks, "notes": result.notes,
                   "curves": {name: c.as_record() for name, c in sorted(result.curves.items())}}
    cas.write_atomic(curves_path, (json.dumps(dict(sorted(data.items())), indent=1) + "\n").encode())
    return curves_path
