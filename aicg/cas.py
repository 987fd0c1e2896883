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
from dataclasses import dataclass, field
from pathlib import Path

from . import digest


_UMASK = os.umask(0)
os.umask(_UMASK)


def write_atomic(path: Path, data: bytes, tmp_dir: Path | None = None) -> None:
    """Write a file so that readers see the old content or the new, never a part.

    The temporary file lives in `tmp_dir` (default: beside the file), which
    must be on the same file system; a writer killed midway leaves only a
    temporary file there, never a partial file under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tmp_dir) if tmp_dir is not None else path.parent
    tmp_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=f".{path.name}.", suffix=".tmp")
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
    """What a step produced under one key: output path -> blob digest (xxh3-128).

    `sha256` names the same blobs for a remote store that addresses content
    by SHA-256 (the Bazel remote cache protocol); it is empty locally.
    `source` is empty for a result a build with this store made or checked, and
    "unsigned:<remote>" for one copied from a remote whose entries carry no
    signature: a copy keeps what it was, so evidence from such a remote is
    never mistaken for this machine's (aicg/trust.py).
    """

    key: str
    step: str
    outputs: dict[str, str]
    sha256: dict[str, str] = field(default_factory=dict)
    source: str = ""


def entry_payload(entry: ActionEntry) -> bytes:
    """The bytes an entry's checksum (and signature, if any) cover."""
    fields = {"key": entry.key, "step": entry.step, "outputs": entry.outputs, "sha256": entry.sha256}
    if entry.source:   # absent otherwise: the entries of earlier releases keep their bytes
        fields["source"] = entry.source
    return digest.pack(fields)


def encode_entry(entry: ActionEntry, signature: bytes | None = None) -> bytes:
    payload = entry_payload(entry)
    envelope = [payload, digest.of_bytes(payload)]
    return digest.pack(envelope + [signature] if signature is not None else envelope)


def decode_entry(data: bytes, with_signature: bool = False):
    """The entry (and its signature, if asked) or None for anything undecodable or corrupt."""
    try:
        envelope = digest.unpack(data)
        payload, checksum = envelope[0], envelope[1]
        signature = envelope[2] if len(envelope) > 2 else None
        if digest.of_bytes(payload) != checksum:
            return None
        fields = digest.unpack(payload)
        entry = ActionEntry(fields["key"], fields["step"], dict(fields["outputs"]), dict(fields.get("sha256", {})),
                            fields.get("source", ""))
    except Exception:  # msgpack raises several types on undecodable input; all are a miss
        return None
    texts = [entry.key, entry.step, entry.source, *entry.outputs.items(), *entry.sha256.items()]
    if not all(isinstance(t, str) for t in _flat(texts)):
        return None
    return (entry, payload, signature) if with_signature else entry


def _flat(items):
    for item in items:
        yield from item if isinstance(item, tuple) else (item,)


class Store:
    """The local store. Reads refresh a file's mtime, so `gc` can drop the least recently used."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.tmp = self.root / "tmp"

    def _write(self, path: Path, data: bytes) -> None:
        write_atomic(path, data, self.tmp)

    @staticmethod
    def _touch(path: Path) -> None:
        try:
            os.utime(path)
        except OSError:
            pass

    def _object_path(self, blob_digest: str) -> Path:
        return self.root / "objects" / blob_digest[:2] / blob_digest[2:]

    def _action_path(self, key: str) -> Path:
        return self.root / "actions" / key[:2] / key[2:]

    def put_blob(self, data: bytes) -> str:
        blob_digest = digest.of_bytes(data)
        if self.get_blob(blob_digest) is None:   # absent, or present but corrupt: (re)write it
            self._write(self._object_path(blob_digest), data)
        return blob_digest

    def get_blob(self, blob_digest: str) -> bytes | None:
        path = self._object_path(blob_digest)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if digest.of_bytes(data) != blob_digest:
            return None
        self._touch(path)
        return data

    def put_action(self, entry: ActionEntry) -> None:
        self._write(self._action_path(entry.key), encode_entry(entry))

    def get_action(self, key: str) -> ActionEntry | None:
        """The entry for `key` if it is intact (its blobs are checked by fetch_outputs)."""
        path = self._action_path(key)
        try:
            entry = decode_entry(path.read_bytes())
        except OSError:
            return None
        if entry is None or entry.key != key:
            return None
        self._touch(path)
        return entry

    def entries(self):
        """(path, size, mtime) of every object and action entry, for stats and gc."""
        for kind in ("objects", "actions"):
            for path in (self.root / kind).glob("*/*"):
                try:
                    st = path.stat()
                except OSError:
                    continue
                yield path, st.st_size, st.st_mtime

    def gc(self, max_bytes: int) -> tuple[int, int]:
        """Delete least recently used files until the store holds at most max_bytes.
        Returns (files removed, bytes removed). An action whose blob went is a miss."""
        files = sorted(self.entries(), key=lambda e: e[2])
        total = sum(size for _, size, _ in files)
        removed = freed = 0
        for path, size, _ in files:
            if total <= max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            removed, freed = removed + 1, freed + size
        return removed, freed

    def fetch_outputs(self, entry: ActionEntry) -> dict[str, bytes] | None:
        """All outputs of an entry, each checked against its digest; None if any is missing or bad."""
        outputs = {}
        for relpath, blob_digest in entry.outputs.items():
            data = self.get_blob(blob_digest)
            if data is None:
                return None
            outputs[relpath] = data
        return outputs
