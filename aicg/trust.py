"""What a build and a loaded instance take on trust, and what they check.

A store entry is *content* or *evidence* or a *verdict*, by the step that made it:

- content (hw, legality, plan, codegen, compile): a fact anyone can recompute
  from the step's inputs. Taken from any store that passes the digest checks;
  a cubin taken from elsewhere is still validated before it is trusted to run.
- evidence (validate, synth): what a GPU measured. From the local store, a
  run on this machine, or a remote whose entries are signed with the
  configured key, it counts; from a remote without a key it is kept but
  marked untrusted, and every kernel resting on it is "unverified", never
  "passed", until a trusted source says so.
- verdict (select, package): a decision drawn from evidence. Never taken from
  an unsigned remote: it is cheap, and computed here from the evidence above.

Whatever its origin, an entry may only write the outputs its step declares,
as plain relative paths inside the instance: an entry naming `../x` or an
absolute path is a miss (an entry naming a path its step does not declare,
likewise).

A packaged instance is the user's own directory: `aicg.load` trusts its
manifest as it would any file there, unless a signing key is configured
(AICG_SIGNING_KEY_FILE). Then the build writes `manifest.json.sig` (HMAC-
SHA256 of the manifest with that key) and the JIT a `.sig` beside each of its
records, and a load checks them: an unsigned or wrongly signed manifest is
refused, an unsigned JIT record is ignored and made again.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from pathlib import Path, PurePosixPath

from . import cas, digest
from .errors import InputError

log = logging.getLogger("aicg.trust")

ROLES = ("content", "evidence", "verdict")
KEY_VARIABLE = "AICG_SIGNING_KEY_FILE"
SIGNATURE_SUFFIX = ".sig"


def safe_relpath(relpath: object) -> bool:
    """Whether an output path is a plain relative path inside the instance: no root, no `..`,
    no hidden part (the instance's own .receipts and .tmp), no backslash or NUL."""
    if not isinstance(relpath, str) or not relpath or "\\" in relpath or "\0" in relpath:
        return False
    path = PurePosixPath(relpath)
    return not path.is_absolute() and all(part not in ("", "..") and not part.startswith(".") for part in path.parts)


def undeclared_outputs(outputs, declared) -> list[str]:
    """The output paths a step may not write: not declared by it, or not plain paths inside the instance."""
    return sorted(str(p) for p in outputs if p not in declared or not safe_relpath(p))


def key_from_environment() -> bytes | None:
    """The signing key named by AICG_SIGNING_KEY_FILE, or None where the variable is unset."""
    where = os.environ.get(KEY_VARIABLE)
    if not where:
        return None
    try:
        key = Path(where).read_bytes().strip()
    except OSError:
        raise InputError(where, KEY_VARIABLE, "a readable file holding the shared key") from None
    if not key:
        raise InputError(where, KEY_VARIABLE, "a non-empty key")
    return key


def signature(data: bytes, key: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def verify(data: bytes, key: bytes, signature_hex: object) -> bool:
    return isinstance(signature_hex, str) and hmac.compare_digest(signature_hex, signature(data, key))


def signature_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + SIGNATURE_SUFFIX)


def write_signature(path: Path, data: bytes, key: bytes | None, write) -> None:
    """Sign `data` (the content of `path`) beside it with `write(path, bytes)`; without a key,
    remove a signature left there, which could only mislead."""
    if key is None:
        signature_path(path).unlink(missing_ok=True)
    else:
        write(signature_path(path), (signature(data, key) + "\n").encode())


def signed_by(path: Path, data: bytes, key: bytes) -> bool:
    """Whether the signature beside `path` is `key`'s over `data`."""
    try:
        stored = signature_path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return False
    return verify(data, key, stored)


def read_json_record(path: Path, key: bytes | None) -> dict | None:
    """A JSON record a process wrote for later ones (a JIT's compile or validation), or None where it
    is absent, unreadable, not an object or (with a key) not signed with it."""
    try:
        data = path.read_bytes()
        record = json.loads(data)
    except (OSError, ValueError):
        return None
    if key is not None and not signed_by(path, data, key):
        log.warning("aicg: %s is not signed with the configured key; it is made again", path)
        return None
    return record if isinstance(record, dict) else None


def packaged_cubin(instance_dir: Path, entry: dict, error=RuntimeError) -> bytes:
    """The cubin a manifest entry names (its "cubin" path in the instance), checked against the
    entry's "cubin_digest" before anything loads it; `error` where it is missing or differs."""
    path = Path(instance_dir) / entry["cubin"]
    cubin = digest.read_checked(path, entry["cubin_digest"])
    if cubin is None:
        raise error(f"{path}: missing or its digest does not match the manifest")
    return cubin


def write_json_record(path: Path, record: dict, key: bytes | None) -> None:
    """`record` written atomically as JSON, signed beside it with `key` where there is one."""
    data = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
    cas.write_atomic(path, data)
    write_signature(path, data, key, cas.write_atomic)
