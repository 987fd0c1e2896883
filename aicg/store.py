"""The store a build uses: the local store first, a shared remote second.

A hit in the remote is checked (its entry's checksum, its signature when a
key is configured, every blob against both its SHA-256 and its xxh3 digest)
and written back to the local store. Anything wrong is a miss: the step runs
and, in write mode, its result replaces the bad entry. A remote that fails
to answer is reported once and left alone for the rest of the build, which
then runs at the speed of a local one.

Without a key, a remote's entries are taken as content but not as evidence:
a hit says whether it is trusted, and its local copy remembers that it came
from an unsigned remote (aicg/trust.py says what each step makes of it). A
local store that cannot be written (a shared cache mounted read-only) is
read as usual and written never, with one warning.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import sys
from collections import Counter
from dataclasses import dataclass

from . import cas, digest, record, remote as remotes
from .config import StoreConfig


def action_name(key: str) -> str:
    """The /ac/ name of a key: 64 hex digits, as the Bazel protocol expects."""
    return hashlib.sha256(f"aicg-action-v1:{key}".encode()).hexdigest()


UNSIGNED = "unsigned:"   # the source of a local copy of an unsigned remote entry


@dataclass(frozen=True)
class Hit:
    outputs: dict[str, bytes]
    origin: str      # "local" or "remote"
    trusted: bool    # False: the entry came, now or earlier, from a remote whose entries carry no signature


class LayeredStore:
    def __init__(self, config: StoreConfig, warn=None):
        self.config = config
        self.local = cas.Store(config.local)
        self.remote = remotes.connect(config.remote, config.timeout) if config.remote else None
        self.stats: Counter = Counter()
        self.records: list[record.Record] = []   # read-only layers under the local store (aicg/record.py)
        self.local_writable = True
        self._bad_blobs: set[str] = set()
        self._warn = warn or (lambda message: print(message, file=sys.stderr, flush=True))

    def attach_record(self, path) -> None:
        """Read the validation record at `path` (if any) under the local store; with a signing key,
        only its signed lines."""
        self.records.append(record.Record(path, self.config.signing_key))

    def refuse(self, message: str) -> None:
        """Report an entry that passed its digest checks but is not taken (see trust.py)."""
        self.stats["refused_entries"] += 1
        self._warn(f"aicg: warning: {message}")

    def _local_write(self, write, *args):
        """A write to the local store, or nothing once it has proved read-only."""
        if not self.local_writable:
            return None
        try:
            return write(*args)
        except OSError as err:
            self.local_writable = False
            self._warn(f"aicg: warning: the local store {self.local.root} cannot be written ({err.strerror or err}); "
                       f"it is read and nothing more is kept in it")
            self.stats["local_read_only"] += 1
            return None

    # -- signing -------------------------------------------------------------
    def _sign(self, payload: bytes) -> bytes | None:
        key = self.config.signing_key
        return hmac.new(key, payload, hashlib.sha256).digest() if key else None

    def _trusted(self, payload: bytes, signature: bytes | None) -> bool:
        if not self.config.signing_key:
            return True
        return signature is not None and hmac.compare_digest(self._sign(payload), signature)

    # -- the remote, guarded ---------------------------------------------------
    def _remote_call(self, method: str, *args):
        if self.remote is None:
            return None
        try:
            return getattr(self.remote, method)(*args)
        except remotes.Unavailable as err:
            self._warn(f"aicg: warning: remote store {self.remote.where} unavailable ({err}); "
                       f"continuing with the local store only")
            self.stats["remote_unavailable"] += 1
            self.remote = None
            return None

    def _fetch_remote(self, key: str):
        data = self._remote_call("get", "ac", action_name(key))
        if data is None:
            return None
        decoded = cas.decode_entry(data, with_signature=True)
        if decoded is None or decoded[0].key != key:
            self.stats["remote_corrupt_entries"] += 1
            return None
        entry, payload, signature = decoded
        if not self._trusted(payload, signature):
            self.stats["remote_untrusted_entries"] += 1
            return None
        outputs = {}
        for relpath, blob_digest in entry.outputs.items():
            sha = entry.sha256.get(relpath)
            blob = self._remote_call("get", "cas", sha) if sha else None
            if blob is None:
                self.stats["remote_missing_blobs"] += 1
                return None
            if hashlib.sha256(blob).hexdigest() != sha or digest.of_bytes(blob) != blob_digest:
                self.stats["remote_corrupt_blobs"] += 1
                self._bad_blobs.add(sha)
                return None
            outputs[relpath] = blob
            self.stats["bytes_down"] += len(blob)
        signed = self.config.signing_key is not None
        self._record_local(key, entry.step, outputs, "" if signed else UNSIGNED + self.remote.where)
        return outputs, signed

    # -- what steps call -------------------------------------------------------
    def holds_here(self, key: str) -> bool:
        """Whether the local store or a record holds an entry under `key` (no remote is asked, no
        output read): what a build about to run a step may skip preparing."""
        if self.config.recache:
            return False
        return self.local.get_action(key) is not None or any(layer.lookup(key) is not None for layer in self.records)

    def lookup(self, key: str, unsigned_ok: bool = True) -> Hit | None:
        """The outputs stored under `key`, or None for a miss. `unsigned_ok=False` takes nothing
        that came from an unsigned remote (a step whose result vouches for others, see trust.py)."""
        if self.config.recache:
            self.stats["recache_skips"] += 1
            return None
        entry = self.local.get_action(key)
        outputs = self.local.fetch_outputs(entry) if entry else None
        if outputs is not None and (unsigned_ok or not entry.source.startswith(UNSIGNED)):
            self.stats["local_hits"] += 1
            return Hit(outputs, "local", not entry.source.startswith(UNSIGNED))
        for layer in self.records:
            outputs = layer.lookup(key)
            if outputs is not None:
                self.stats["record_hits"] += 1
                return Hit(outputs, "record", True)
        if unsigned_ok or self.config.signing_key is not None:
            fetched = self._fetch_remote(key)
            if fetched is not None:
                self.stats["remote_hits"] += 1
                return Hit(fetched[0], "remote", fetched[1])
        self.stats["misses"] += 1
        return None

    def _record_local(self, key: str, step: str, outputs: dict[str, bytes], source: str = "") -> cas.ActionEntry:
        entry = cas.ActionEntry(key, step, {relpath: digest.of_bytes(data) for relpath, data in outputs.items()},
                                source=source)
        if self._local_write(lambda: [self.local.put_blob(data) for data in outputs.values()]) is not None:
            self._local_write(self.local.put_action, entry)
        return entry

    def write_build_stats(self, instance: str) -> None:
        """The counters of the last build (`doit cache stats` shows them), where the store can be written."""
        data = (json.dumps({"instance": instance, "remote": self.config.remote, "counters": dict(sorted(self.stats.items()))},
                           indent=1) + "\n").encode()
        self._local_write(cas.write_atomic, self.local.root / "last-build.json", data, self.local.tmp)

    def record(self, key: str, step: str, outputs: dict[str, bytes]) -> None:
        entry = self._record_local(key, step, outputs)
        if self.remote is None or not self.config.writable:
            return
        shas = {relpath: hashlib.sha256(data).hexdigest() for relpath, data in outputs.items()}
        for relpath, data in outputs.items():
            sha = shas[relpath]
            if sha in self._bad_blobs or not self._remote_call("has", "cas", sha):
                if self.remote is None:
                    return
                self._remote_call("put", "cas", sha, data)
                self.stats["bytes_up"] += len(data)
        remote_entry = cas.ActionEntry(key, step, entry.outputs, shas)
        signature = self._sign(cas.entry_payload(remote_entry))
        self._remote_call("put", "ac", action_name(key), cas.encode_entry(remote_entry, signature))
        self.stats["remote_writes"] += 1
