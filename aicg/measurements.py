"""The JSON files of measurements kept beside a GPU's hwdb entry: the row lab's realisation profile
(aicg/primitives/realisation.py) and the matrix profile (aicg/matrix/calibration.py).

Each is {"schema": 1, "provenance": {...}, "records": [...]}: the provenance of the run (date,
driver, clocks, method, repetitions, device, arch, and what else the writer adds) and one record
per measurement. Reading checks the document's shape and names the key that is wrong; each kind
checks its own records.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from . import cas, digest
from .errors import InputError

SCHEMA = 1
PROVENANCE = ("date", "driver", "clocks", "method", "repetitions", "device", "arch")


@dataclass(frozen=True)
class Measurements:
    path: Path
    provenance: dict
    records: tuple[dict, ...]

    @functools.cached_property
    def digest(self) -> str:
        return digest.of_value({"provenance": self.provenance, "records": list(self.records)})


def read(path: Path, what: str) -> tuple[dict, list] | None:
    """(provenance, records) of the file at `path` (None: there is none), its shape checked; `what`
    names the kind in errors ("realisation profile")."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise InputError(path, "(file)", f"a {what} (JSON), not a directory") from None
    except OSError as err:
        raise InputError(path, "(file)", f"a readable {what} (JSON)", err.strerror or str(err)) from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise InputError(path, "(encoding)", "UTF-8 text", f"byte 0x{raw[err.start]:02x} on line {line}") from None
    except json.JSONDecodeError as err:
        raise InputError(path, "(syntax)", "valid JSON", str(err)) from None
    if not isinstance(data, dict):
        raise InputError(path, "(document)", "a JSON object with schema, provenance and records",
                         type(data).__name__)
    if data.get("schema") != SCHEMA:
        raise InputError(path, "schema", str(SCHEMA), data.get("schema"))
    provenance = data.get("provenance", {})
    if not isinstance(provenance, dict):
        raise InputError(path, "provenance", "a table of the run's provenance", provenance)
    for key in PROVENANCE:
        if key not in provenance:
            raise InputError(path, f"provenance.{key}", "a value (the key is missing)")
    records = data.get("records")
    if not isinstance(records, list) or not records:
        raise InputError(path, "records", "a non-empty list of measurements")
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise InputError(path, f"records[{i}]", "a measurement (a JSON object)", r)
    return provenance, records


def save(path: Path, provenance: dict, records: list[dict]) -> None:
    """Written whole or not at all; one record a line."""
    text = json.dumps({"schema": SCHEMA, "provenance": provenance, "records": records}, separators=(",", ":"))
    if records:
        first = next(iter(records[0]))
        text = text.replace(f'}},{{"{first}"', f'}},\n{{"{first}"')
    cas.write_atomic(Path(path), (text + "\n").encode())
