"""Reading TOML inputs strictly: every key consumed, every type checked.

A `Table` wraps one TOML table and remembers which keys the loader read;
`done()` then rejects any key nobody asked for, so a typo in a rule set is an
error naming the file and the key instead of a silently ignored setting.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

from . import suggest
from .errors import InputError

_MISSING = object()

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "an array", dict: "a table"}
_PLURAL_NAMES = {str: "strings", int: "integers", float: "numbers", bool: "true or false values",
                 list: "arrays", dict: "tables"}


# Limits on what is read as an input at all: the largest shipped TOML is a few tens of KiB, and
# everything is held in memory and hashed into step keys.
MAX_BYTES = 2**20
INT64 = range(-2**63, 2**63)   # what a step key (msgpack) and the CUDA side can hold


def read(path: Path) -> "Table":
    path = Path(path)
    return Table(path, _parse(path, _read_bytes(path)), "")


def read_optional(path: Path) -> "Table | None":
    """The table at `path`, or None where there is no file (a directory or an unreadable file is an error)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    return read(path)


def _read_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise InputError(path, "(file)", "an existing TOML file") from None
    except IsADirectoryError:
        raise InputError(path, "(file)", "a TOML file, not a directory") from None
    except OSError as err:
        raise InputError(path, "(file)", "a readable TOML file", err.strerror or str(err)) from None
    if len(data) > MAX_BYTES:
        raise InputError(path, "(file)", f"a TOML file of at most {MAX_BYTES} bytes", f"{len(data)} bytes or more")
    return data


def _parse(path: Path, data: bytes) -> dict:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(path, "(encoding)", "UTF-8 text",
                         f"byte 0x{data[err.start]:02x} on line {line}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError(path, "(syntax)", "valid TOML", str(err)) from None
    except RecursionError:
        raise InputError(path, "(syntax)", "valid TOML, its arrays and inline tables nested less deeply",
                         "nesting too deep to read") from None


def _type_ok(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and (
            isinstance(value, float) or value in INT64)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and value in INT64
    return isinstance(value, kind)


def _too_wide(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value not in INT64


class Table:
    def __init__(self, file: Path, data: dict, prefix: str):
        self.file, self.data, self.prefix = file, data, prefix
        self._seen: set[str] = set()

    def dotted(self, key: str) -> str:
        """The key's full name in its file, as errors name it."""
        return f"{self.prefix}.{key}" if self.prefix else key

    _path = dotted   # the name loaders used before

    def error(self, key: str, expected: str, found=None) -> InputError:
        return InputError(self.file, self.dotted(key), expected, found)

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def keys(self) -> list[str]:
        return list(self.data)

    def get(self, key: str, kind, default=_MISSING, choices=None, item=None):
        """Value of `key`, checked to be of `kind` (and in `choices`; list items of `item`)."""
        self._seen.add(key)
        if key not in self.data:
            if default is _MISSING:
                raise self.error(key, f"{_TYPE_NAMES.get(kind, kind)} (the key is missing)")
            return default
        value = self.data[key]
        if not _type_ok(value, kind):
            wide = _too_wide(value) and kind in (int, float)
            raise self.error(key, "an integer of at most 64 bits" if wide else _TYPE_NAMES.get(kind, str(kind)), value)
        if item is not None:
            for element in value:
                if not _type_ok(element, item):
                    wide = _too_wide(element) and item in (int, float)
                    raise self.error(key, "an array of " + ("integers of at most 64 bits" if wide
                                                            else _PLURAL_NAMES.get(item, str(item))), value)
        if choices is not None:
            values = value if isinstance(value, list) else [value]
            for element in values:
                if element not in choices:
                    error = self.error(key, "one of " + ", ".join(map(repr, sorted(choices))), element)
                    raise suggest.hinted(error, suggest.did_you_mean(str(element), map(str, choices)))
        return value

    def table(self, key: str, default=_MISSING) -> "Table":
        if default is not _MISSING and key not in self.data:
            self._seen.add(key)
            return Table(self.file, {}, self.dotted(key))
        return Table(self.file, self.get(key, dict), self.dotted(key))

    def tables(self) -> list[tuple[str, "Table"]]:
        """Every key of this table as a sub-table (for maps of named entries)."""
        return [(name, self.table(name)) for name in list(self.data)]

    def done(self) -> None:
        unknown = sorted(set(self.data) - self._seen)
        if unknown:
            known = ", ".join(sorted(self._seen)) or "nothing"
            raise suggest.hinted(self.error(unknown[0], f"a known key (this table knows: {known})"),
                                 suggest.did_you_mean(unknown[0], self._seen))
