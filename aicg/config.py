"""Where the store lives and which remote it shares, from one place.

Each setting is read, first found wins, from: the environment, the
profile's [cache] table, then [tool.aicg] in the project's pyproject.toml.

    setting        environment              TOML key   default
    local store    AICG_CACHE_DIR           cache      <project>/cache
    remote store   AICG_REMOTE              remote     none (http(s)://host/prefix, or a directory:
                                                           absolute, or ./ or ../ from the project)
    remote mode    AICG_REMOTE_MODE         mode       "read" ("write" for trusted builders)
    timeout (s)    AICG_REMOTE_TIMEOUT      timeout    5
    signing key    AICG_SIGNING_KEY_FILE    -          none (secrets never live in TOML)
    recache        AICG_RECACHE=1 or doit var recache=1: ignore every hit, overwrite entries
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from . import tomlfile
from .errors import InputError

KEYS = {"cache": str, "remote": str, "mode": str, "timeout": float}
MODES = {"read", "write"}
ENVIRONMENT = {"cache": "AICG_CACHE_DIR", "remote": "AICG_REMOTE", "mode": "AICG_REMOTE_MODE",
               "timeout": "AICG_REMOTE_TIMEOUT"}
# Every environment variable aicg reads: what a kept graph is keyed by (aicg/cli_graph.py); other
# AICG_-named variables (a CI's own switches) shape nothing.
VARIABLES = (*ENVIRONMENT.values(), "AICG_SIGNING_KEY_FILE", "AICG_RECACHE")
EXPECTED = {
    "cache": "a directory path (no control characters)",
    "remote": "an http:// or https:// URL with a host, or a directory path that is absolute or starts with "
              "./ or ../ (no control characters)",
    "mode": "'read' or 'write'",
    "timeout": "a positive finite number of seconds",
}


@dataclass(frozen=True)
class StoreConfig:
    local: Path
    remote: str | None
    writable: bool
    timeout: float
    signing_key: bytes | None
    recache: bool


class Settings(dict):
    """Store settings, checked, remembering where each was set: key -> (file, key in that file)."""

    def __init__(self, values=(), origins=None):
        super().__init__(values)
        self.origins: dict[str, tuple[str, str]] = dict(origins or {})


def _plain(text: str) -> bool:
    return bool(text) and not any(ord(c) < 32 or ord(c) == 127 for c in text)


def _valid(key: str, value) -> bool:
    if key == "cache":
        return _plain(value)
    if key == "remote":
        if not _plain(value):
            return False
        if "://" in value:
            scheme, _, rest = value.partition("://")
            return scheme in ("http", "https") and bool(rest.split("/")[0])
        return value.startswith(("/", "./", "../"))
    if key == "mode":
        return value in MODES
    return 0 < value < math.inf    # timeout; NaN fails both comparisons


def _pyproject(root: Path) -> tomlfile.Table:
    path = root / "pyproject.toml"
    doc = tomlfile.read_optional(path)
    if doc is None:
        return tomlfile.Table(path, {}, "tool.aicg")
    return doc.table("tool", default={}).table("aicg", default={})


def settings(table: tomlfile.Table) -> Settings:
    """The store settings of a [cache] or [tool.aicg] table, checked."""
    found = Settings()
    for key, kind in KEYS.items():
        if key in table:
            found[key] = table.get(key, kind)
            if not _valid(key, found[key]):
                raise table.error(key, EXPECTED[key], found[key])
            found.origins[key] = (str(table.file), table.dotted(key))
    table.done()
    return found


def _environment() -> Settings:
    found = Settings()
    for key, name in ENVIRONMENT.items():
        text = os.environ.get(name)
        if not text:
            continue
        value = text
        if KEYS[key] is float:
            try:
                value = float(text)
            except ValueError:
                raise InputError("environment", name, EXPECTED[key], text) from None
        if not _valid(key, value):
            raise InputError("environment", name, EXPECTED[key], text)
        found[key], found.origins[key] = value, ("environment", name)
    return found


def _local_store(root: Path, setting: tuple | None) -> Path:
    """The local store's directory: it, or the first of its parents that exists, must be a directory."""
    value, (file, key) = setting or ("cache", (str(root / "cache"), "(local store)"))
    local = Path(value)
    local = local if local.is_absolute() else root / local
    existing = local
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(file, key, "a directory for the local store, or a path where one can be made "
                         f"({existing} is not a directory)", value)
    return local


def load(root: Path, profile_cache: dict | None = None, recache: bool = False) -> StoreConfig:
    root = Path(root)
    layers = [_environment(), profile_cache or Settings(), settings(_pyproject(root))]   # first found wins

    def setting(key: str) -> tuple | None:
        for layer in layers:
            if key in layer:
                return layer[key], getattr(layer, "origins", {}).get(key, ("profile", f"cache.{key}"))
        return None

    def value(key: str, default):
        found = setting(key)
        return default if found is None else found[0]

    local = _local_store(root, setting("cache"))
    remote = value("remote", None)
    if remote is not None and not remote.startswith(("http://", "https://")) and not Path(remote).is_absolute():
        remote = str(root / remote)    # ./ or ../: from the project, as the local store is
    mode, timeout = value("mode", "read"), value("timeout", 5.0)
    env = os.environ
    key = None
    if env.get("AICG_SIGNING_KEY_FILE"):
        key_path = Path(env["AICG_SIGNING_KEY_FILE"])
        try:
            key = key_path.read_bytes().strip()
        except (OSError, ValueError):
            raise InputError(key_path, "AICG_SIGNING_KEY_FILE", "a readable file holding the shared key") from None
        if not key:
            raise InputError(key_path, "AICG_SIGNING_KEY_FILE", "a non-empty key")
    recache = recache or env.get("AICG_RECACHE", "") not in ("", "0")
    return StoreConfig(local, remote, mode == "write", timeout, key, recache)
