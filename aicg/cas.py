"""Content-addressed store: blobs by digest and action entries by key.

Layout under the store's root::

    objects/ab/<rest of digest>    raw bytes of an artifact
    actions/ab/<rest of key>       msgpack [payload, digest(payload)]

Every write goes to a temporary file in the same folder and is renamed into
place, so a reader sees a whole entry or none. Every read checks the digest:
a corrupt, truncated or foreign entry is a miss, never a crash or a wrong
artifact. Only successful results are ever put here.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import digest


_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old content or the new, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)   # mkstemp makes 0600; a shared store must stay readable
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class ActionEntry:
    """What a step produced under one key: output path -> blob digest, plus metadata."""

    key: str
    step: str
    outputs: dict[str, str]


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)

    def _object_path(self, blob_digest: str) -> Path:
        return self.root / "objects" / blob_digest[:2] / blob_digest[2:]

    def _action_path(self, key: str) -> Path:
        return self.root / "actions" / key[:2] / key[2:]

    def put_blob(self, data: bytes) -> str:
        blob_digest = digest.of_bytes(data)
        if self.get_blob(blob_digest) is None:   # absent, or present but corrupt: (re)write it
            write_atomic(self._object_path(blob_digest), data)
        return blob_digest

    def get_blob(self, blob_digest: str) -> bytes | None:
        try:
            data = self._object_path(blob_digest).read_bytes()
        except OSError:
            return None
        return data if digest.of_bytes(data) == blob_digest else None

    def put_action(self, entry: ActionEntry) -> None:
        payload = digest.pack({"key": entry.key, "step": entry.step, "outputs": entry.outputs})
        write_atomic(self._action_path(entry.key), digest.pack([payload, digest.of_bytes(payload)]))

    def get_action(self, key: str) -> ActionEntry | None:
        """The entry for `key` if it is intact (its blobs are checked by fetch_outputs)."""
        try:
            payload, checksum = digest.unpack(self._action_path(key).read_bytes())
            if digest.of_bytes(payload) != checksum:
                return None
            fields = digest.unpack(payload)
            entry = ActionEntry(fields["key"], fields["step"], dict(fields["outputs"]))
        except Exception:  # unreadable or undecodable: msgpack raises several types; all are a miss
            return None
        if entry.key != key:
            return None
        return entry

    def fetch_outputs(self, entry: ActionEntry) -> dict[str, bytes] | None:
        """All outputs of an entry, each checked against its digest; None if any is missing or bad."""
        outputs = {}
        for relpath, blob_digest in entry.outputs.items():
            data = self.get_blob(blob_digest)
            if data is None:
                return None
            outputs[relpath] = data
        return outputs
