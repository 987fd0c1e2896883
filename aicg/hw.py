"""Hardware database entries (`hwdb/<target>.toml`) as frozen records.

An entry holds datasheet facts, each with its source, and measured facts,
each with its provenance (date, driver, method, repetitions, spread).
Resolution takes the measured value where both exist. The planner reads
single facts by name, so a task's key can hold exactly the facts it uses.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import tomlfile
from .errors import InputError

# Every entry must state these; unit strings are checked so that a value in
# the wrong unit (GB/s for byte/s, say) is caught when the entry is read.
REQUIRED_FACTS: dict[str, str] = {
    "sm_count": "SM",
    "warp_size": "thread",
    "max_threads_per_block": "thread",
    "max_threads_per_sm": "thread",
    "max_blocks_per_sm": "block",
    "registers_per_sm": "32-bit register",
    "max_registers_per_thread": "32-bit register",
    "shared_memory_per_block": "byte",
    "shared_memory_per_block_optin": "byte",
    "shared_memory_per_sm": "byte",
    "l2_cache": "byte",
    "dram_capacity": "byte",
    "dram_bandwidth": "byte/s",
    "boost_clock": "MHz",
    "fp32_flops": "FLOP/s",
    "bf16_tensor_flops": "FLOP/s",
}

# Where a fact above the measured section comes from: a datasheet (written by people, `ref` says
# where), or the CUDA driver (written by `doit probe` for a GPU new to hwdb/, `ref` says how:
# aicg/probe/new_entry.py).
FACT_SOURCES = ("datasheet", "driver")

# Units of facts that count whole things: their values are whole numbers.
COUNTED_UNITS = {"SM", "thread", "block", "32-bit register"}

# What every measured fact records besides its value and unit (written by `doit probe`).
MEASURED_PROVENANCE = ("probe", "date", "driver", "clocks", "method", "repetitions", "spread")


@dataclass(frozen=True)
class Fact:
    value: float | int
    unit: str
    source: str              # "datasheet", "driver" or "measured"
    ref: str                 # where a datasheet value is stated, or how it was measured
    provenance: tuple = ()   # measured facts: (key, value) pairs of MEASURED_PROVENANCE


@dataclass(frozen=True)
class Hardware:
    target: str                        # file stem: the name profiles use
    name: str                          # as the CUDA driver reports the device
    arch: str                          # NVRTC target, e.g. "sm_90"
    compute_capability: tuple[int, int]
    facts: dict[str, Fact] = field(hash=False)          # measured where measured, else datasheet
    datasheet: dict[str, Fact] = field(hash=False, default_factory=dict)   # the datasheet facts alone

    def fact(self, name: str) -> float | int:
        return self.facts[name].value

    def identity(self) -> dict:
        """What makes two devices the same hardware for validation results."""
        return {"name": self.name, "arch": self.arch,
                "compute_capability": list(self.compute_capability),
                "sm_count": self.fact("sm_count")}

    def as_record(self) -> dict:
        return {"target": self.target, **self.identity(),
                "facts": {name: {"value": f.value, "unit": f.unit, "source": f.source, "ref": f.ref,
                                 **dict(f.provenance)}
                          for name, f in sorted(self.facts.items())}}


def read_measured_fact(table: tomlfile.Table, name: str) -> Fact:
    return _read_fact(table, name, measured=True)


def _read_fact(table: tomlfile.Table, name: str, measured: bool) -> Fact:
    value = table.get("value", float)
    unit = table.get("unit", str)
    expected_unit = REQUIRED_FACTS.get(name)
    if expected_unit is not None and unit != expected_unit:
        raise table.error("unit", repr(expected_unit), unit)
    # Every fact is a size, a count, a rate, a time or a ratio: zero, negative, NaN or infinite
    # is a broken probe or a typo, and would divide by zero or rank kernels by nonsense.
    if unit in COUNTED_UNITS and expected_unit is not None:
        if not (math.isfinite(value) and value >= 1 and value == int(value)):
            raise table.error("value", f"a positive whole number of {unit}s", value)
    elif not (math.isfinite(value) and value > 0):
        raise table.error("value", "a positive finite number", value)
    if measured:
        kinds = {"repetitions": int, "spread": float}
        provenance = tuple((key, table.get(key, kinds.get(key, str))) for key in MEASURED_PROVENANCE)
        where = dict(provenance)
        if where["repetitions"] < 1:
            raise table.error("repetitions", "an integer >= 1", where["repetitions"])
        if not (math.isfinite(where["spread"]) and where["spread"] >= 0):
            raise table.error("spread", "a finite number >= 0", where["spread"])
        table.done()
        return Fact(value, unit, "measured", table.get("method", str), provenance)
    source = table.get("source", str, choices=set(FACT_SOURCES))
    ref = table.get("ref", str)
    table.done()
    return Fact(value, unit, source, ref)


def load(path: Path) -> Hardware:
    path = Path(path)
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    identity = doc.table("identity")
    name = identity.get("name", str)
    arch = identity.get("arch", str)
    cc = identity.get("compute_capability", list, item=int)
    if len(cc) != 2 or arch != f"sm_{cc[0]}{cc[1]}":
        raise identity.error("arch", f"'sm_<major><minor>' matching compute_capability {cc}", arch)
    identity.done()

    facts: dict[str, Fact] = {}
    for fact_name, table in doc.table("facts").tables():
        facts[fact_name] = _read_fact(table, fact_name, measured=False)
    datasheet = dict(facts)
    for fact_name, table in doc.table("measured", default={}).tables():
        facts[fact_name] = _read_fact(table, fact_name, measured=True)  # measured beats datasheet
    doc.done()

    missing = [f for f in REQUIRED_FACTS if f not in facts]
    if missing:
        raise doc.error(f"facts.{missing[0]}", "a table with value, unit, source and ref (the fact is missing)")
    return Hardware(path.stem, name, arch, (cc[0], cc[1]), facts, datasheet)


# A target names a file of hwdb/ and nothing outside it.
TARGET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def load_target(hwdb_dir: Path, target: str) -> Hardware:
    path = Path(hwdb_dir) / f"{target}.toml"
    if not TARGET_NAME.fullmatch(target) or not path.exists():
        known = sorted(p.stem for p in Path(hwdb_dir).glob("*.toml"))
        raise InputError(path, "target", "a hwdb entry, one of: " + ", ".join(known), target)
    return load(path)
