"""Canonical encoding and digests: the identity of every value aicg stores.

A key is xxh3-128 over a canonical msgpack encoding: maps are written with
their keys sorted, so the same value always gives the same bytes whatever the
order it was built in. Floats keep their full binary value.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgpack
import xxhash


def _canonical(value):
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in sorted(value.items(), key=lambda kv: (type(kv[0]).__name__, kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, Path):
        return value.as_posix()
    return value


def pack(value) -> bytes:
    """Canonical msgpack bytes of a plain value (dicts, lists, str, numbers, bytes, None)."""
    return msgpack.packb(_canonical(value), use_bin_type=True)


def unpack(data: bytes):
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def of_bytes(data: bytes) -> str:
    """Content digest of raw bytes (hex xxh3-128)."""
    return xxhash.xxh3_128_hexdigest(data)


def of_value(value) -> str:
    """Digest of a plain value through its canonical encoding."""
    return of_bytes(pack(value))


def of_file(path: Path) -> str:
    return of_bytes(Path(path).read_bytes())


def read_checked(path: Path, expected: str | None) -> bytes | None:
    """The file's bytes where their digest is `expected`; None where it is missing or differs."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    return data if of_bytes(data) == expected else None
