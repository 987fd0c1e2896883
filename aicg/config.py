"""Where the store lives and which remote it shares, from one place.

Each setting is read, first found wins, from: the environment, the
profile's [cache] table, then [tool.aicg] in the project's pyproject.toml.

    setting        environment              TOML key   default
    local store    AICG_CACHE_DIR           cache      <project>/cache
    remote store   AICG_REMOTE              remote     none (a directory, or http(s)://host/prefix)
    remote mode    AICG_REMOTE_MODE         mode       "read" ("write" for trusted builders)
    timeout (s)    AICG_REMOTE_TIMEOUT      timeout    5
    signing key    AICG_SIGNING_KEY_FILE    -          none (secrets never live in TOML)
    recache        AICG_RECACHE=1 or doit var recache=1: ignore every hit, overwrite entries
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import tomlfile
from .errors import InputError

KEYS = {"cache": str, "remote": str, "mode": str, "timeout": float}
MODES = {"read", "write"}


@dataclass(frozen=True)
class StoreConfig:
    local: Path
    remote: str | None
    writable: bool
    timeout: float
    signing_key: bytes | None
    recache: bool


def _pyproject(root: Path) -> tomlfile.Table:
    path = root / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text()).get("tool", {}).get("aicg", {})
    except FileNotFoundError:
        data = {}
    except tomllib.TOMLDecodeError as err:
        raise InputError(path, "(syntax)", "valid TOML", str(err)) from None
    return tomlfile.Table(path, data, "tool.aicg")


def settings(table: tomlfile.Table) -> dict:
    """The store settings of a [cache] or [tool.aicg] table, checked."""
    found = {key: table.get(key, kind) for key, kind in KEYS.items() if key in table}
    table.done()
    if "mode" in found and found["mode"] not in MODES:
        raise table.error("mode", "'read' or 'write'", found["mode"])
    return found


def load(root: Path, profile_cache: dict | None = None, recache: bool = False) -> StoreConfig:
    root = Path(root)
    merged = settings(_pyproject(root))
    merged.update(profile_cache or {})
    env = os.environ
    local = Path(env.get("AICG_CACHE_DIR") or merged.get("cache") or root / "cache")
    remote = env.get("AICG_REMOTE") or merged.get("remote") or None
    mode = env.get("AICG_REMOTE_MODE") or merged.get("mode") or "read"
    if mode not in MODES:
        raise InputError("environment", "AICG_REMOTE_MODE", "'read' or 'write'", mode)
    try:
        timeout = float(env.get("AICG_REMOTE_TIMEOUT") or merged.get("timeout") or 5.0)
    except ValueError:
        raise InputError("environment", "AICG_REMOTE_TIMEOUT", "a number of seconds", env["AICG_REMOTE_TIMEOUT"]) from None
    key = None
    if env.get("AICG_SIGNING_KEY_FILE"):
        key_path = Path(env["AICG_SIGNING_KEY_FILE"])
        try:
            key = key_path.read_bytes().strip()
        except OSError:
            raise InputError(key_path, "AICG_SIGNING_KEY_FILE", "a readable file holding the shared key") from None
        if not key:
            raise InputError(key_path, "AICG_SIGNING_KEY_FILE", "a non-empty key")
    recache = recache or env.get("AICG_RECACHE", "") not in ("", "0")
    return StoreConfig(local if local.is_absolute() else root / local, remote, mode == "write", timeout, key, recache)
