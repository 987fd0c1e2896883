"""Reading TOML inputs strictly: every key consumed, every type checked.

A `Table` wraps one TOML table and remembers which keys the loader read;
`done()` then rejects any key nobody asked for, so a typo in a rule set is an
error naming the file and the key instead of a silently ignored setting.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

from .errors import InputError

_MISSING = object()

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "an array", dict: "a table"}


def read(path: Path) -> "Table":
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, "(file)", "an existing TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise InputError(path, "(syntax)", "valid TOML", str(err)) from None
    return Table(path, data, "")


def _type_ok(value, kind) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


class Table:
    def __init__(self, file: Path, data: dict, prefix: str):
        self.file, self.data, self.prefix = file, data, prefix
        self._seen: set[str] = set()

    def _path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, expected: str, found=None) -> InputError:
        return InputError(self.file, self._path(key), expected, found)

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
            raise self.error(key, _TYPE_NAMES.get(kind, str(kind)), value)
        if item is not None:
            for element in value:
                if not _type_ok(element, item):
                    raise self.error(key, f"an array of {_TYPE_NAMES.get(item, item)}s", value)
        if choices is not None:
            values = value if isinstance(value, list) else [value]
            for element in values:
                if element not in choices:
                    raise self.error(key, "one of " + ", ".join(map(repr, sorted(choices))), element)
        return value

    def table(self, key: str, default=_MISSING) -> "Table":
        if default is not _MISSING and key not in self.data:
            self._seen.add(key)
            return Table(self.file, {}, self._path(key))
        return Table(self.file, self.get(key, dict), self._path(key))

    def tables(self) -> list[tuple[str, "Table"]]:
        """Every key of this table as a sub-table (for maps of named entries)."""
        return [(name, self.table(name)) for name in list(self.data)]

    def done(self) -> None:
        unknown = sorted(set(self.data) - self._seen)
        if unknown:
            known = ", ".join(sorted(self._seen)) or "nothing"
            raise self.error(unknown[0], f"a known key (this table knows: {known})")
