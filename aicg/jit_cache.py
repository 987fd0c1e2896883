"""The cubins a JIT compiled, kept in the instance: `<key>.cubin` beside its record `<key>.json`.

The key is the kernel's compile key (its source, headers, target, options and
toolchain), so an entry is never reused for anything else. The record says
what was compiled, what ptxas reported, the cubin's digest and the validation
outcome per GPU. The rows', the backward and the matrix JITs keep their
kernels alike, each in a directory of its own.

An entry is used only where it checks out: its record signed with the
configured key where there is one (aicg/trust.py), its cubin present and of
the digest the record names, the record's tables in place. Anything else is
a miss (said so in the log where a record was there): the kernel is compiled
again, never taken on faith.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from . import cas, digest, trust

log = logging.getLogger("aicg.jit")


@dataclass(frozen=True)
class CubinCache:
    directory: Path
    signing_key: bytes | None = None

    def read_record(self, path: Path) -> dict | None:
        """A JSON record of this cache's directory (an entry's or another), None where it is missing,
        damaged or, with a signing key, not signed with it."""
        return trust.read_json_record(path, self.signing_key)

    def write_record(self, path: Path, record: dict) -> None:
        trust.write_json_record(path, record, self.signing_key)

    def cubin_path(self, key: str) -> Path:
        return Path(self.directory) / f"{key}.cubin"

    def record_path(self, key: str) -> Path:
        return Path(self.directory) / f"{key}.json"

    def get(self, key: str, tables: tuple[str, ...] = ("validation",)) -> tuple[bytes, dict] | None:
        """(cubin, record) under `key`, or None where there is none that checks out; `tables` are
        the record's fields that must be JSON objects."""
        record = self.read_record(self.record_path(key))
        if record is None:
            return None
        cubin = digest.read_checked(self.cubin_path(key), record.get("cubin_digest"))
        if cubin is None or not all(isinstance(record.get(name), dict) for name in tables):
            log.warning("aicg: %s is missing or does not match its digest and record; not used",
                        self.cubin_path(key))
            return None
        return cubin, record

    def put(self, key: str, cubin: bytes, record: dict) -> dict:
        """Keep `cubin` under `key` with `record` (its key, the cubin's digest and an empty validation
        table added); returns the record as written."""
        record = {"key": key, **record, "cubin_digest": digest.of_bytes(cubin), "validation": {}}
        cas.write_atomic(self.cubin_path(key), cubin)
        self.write_record(self.record_path(key), record)
        return record

    def keep_outcome(self, record: dict, gpu: str, status: str) -> None:
        """Note a validation outcome on `gpu` in the entry's record, so later processes skip it."""
        record["validation"][gpu] = status
        self.write_record(self.record_path(record["key"]), record)
