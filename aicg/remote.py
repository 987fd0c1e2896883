"""Remote stores speaking the layout of the Bazel HTTP remote cache.

`/ac/<name>` holds action entries and `/cas/<sha256>` content, so
bazel-remote or nginx with WebDAV PUT serve it unchanged, and a shared
directory holds the same two folders. A remote that cannot be reached
raises Unavailable; the layered store then carries on without it.
"""
from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from .cas import write_atomic


class Unavailable(Exception):
    """The remote did not answer properly (down, refusing, too slow, or erroring)."""


class DirRemote:
    """A shared directory (an NFS mount, say) as a remote store."""

    def __init__(self, root: str):
        self.root = Path(root)
        self.where = str(self.root)

    def _path(self, kind: str, name: str) -> Path:
        return self.root / kind / name

    def get(self, kind: str, name: str) -> bytes | None:
        try:
            return self._path(kind, name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise Unavailable(str(err)) from None

    def has(self, kind: str, name: str) -> bool:
        return self._path(kind, name).is_file()

    def put(self, kind: str, name: str, data: bytes) -> None:
        try:
            write_atomic(self._path(kind, name), data, self.root / "tmp")
        except OSError as err:
            raise Unavailable(str(err)) from None


class HttpRemote:
    """GET/HEAD/PUT on <base>/ac/<name> and <base>/cas/<sha256>."""

    def __init__(self, base: str, timeout: float):
        self.base, self.timeout = base.rstrip("/"), timeout
        self.where = self.base

    def _request(self, method: str, kind: str, name: str, data: bytes | None = None):
        request = urllib.request.Request(f"{self.base}/{kind}/{name}", data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return 404, b""
            raise Unavailable(f"{method} {kind}/{name}: HTTP {err.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as err:   # refused, reset, timed out
            raise Unavailable(f"{method} {kind}/{name}: {getattr(err, 'reason', err)}") from None

    def get(self, kind: str, name: str) -> bytes | None:
        status, body = self._request("GET", kind, name)
        return body if status == 200 else None

    def has(self, kind: str, name: str) -> bool:
        return self._request("HEAD", kind, name)[0] == 200

    def put(self, kind: str, name: str, data: bytes) -> None:
        self._request("PUT", kind, name, data)


def connect(where: str, timeout: float):
    return HttpRemote(where, timeout) if where.startswith(("http://", "https://")) else DirRemote(where)
