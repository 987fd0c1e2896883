"""Remote stores speaking the layout of the Bazel HTTP remote cache.

`/ac/<name>` holds action entries and `/cas/<sha256>` content, so
bazel-remote or nginx with WebDAV PUT serve it unchanged, and a shared
directory holds the same two folders. A remote that does not answer properly
(down, refusing, too slow, erroring, or answering what is not HTTP) raises
Unavailable, never anything else; the layered store then carries on without it.

Over HTTP, a process keeps its connections alive (urllib3's pool) and tries a
request again after a transient failure (a reset or closed connection, a
garbled or cut-short answer, 429/500/502/503/504), pausing longer each time.
A request, every try included, has a deadline: the configured timeout, plus
one more timeout for every MiB sent or received so far. A socket timeout
alone bounds each read, so a server sending a byte a second would hold a
build for ever; a watchdog thread cuts the connection of a request past its
deadline.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import socket
import threading
import time
from pathlib import Path

import urllib3

from .cas import write_atomic

MiB = 1 << 20
CHUNK = 64 * 1024                     # read a body in pieces, each earning the request more time
PAUSES = (0.05, 0.25, 1.0)            # seconds before the 2nd, 3rd and 4th try, when the deadline allows
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
STORED = frozenset({200, 201, 204})   # what nginx (201 new, 204 replaced) and bazel-remote (200) answer a PUT


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
        """Whether the remote holds `name`; for content, whether it holds the right bytes
        (a writer relies on the blobs its entries name, so a wrong one is to be replaced)."""
        if kind == "cas":
            return _holds(self.get(kind, name), name)
        return self._path(kind, name).is_file()

    def put(self, kind: str, name: str, data: bytes) -> None:
        try:
            write_atomic(self._path(kind, name), data, self.root / "tmp")
        except OSError as err:
            raise Unavailable(str(err)) from None


def _holds(blob: bytes | None, sha256: str) -> bool:
    return blob is not None and hashlib.sha256(blob).hexdigest() == sha256


class _Request:
    """One request, every try of it, and the connection carrying the current try."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.connection = None
        self.cut_off = False

    def cut(self) -> None:
        """Shut the connection's socket, so that a read blocked in another thread returns at once."""
        self.cut_off = True
        sock = getattr(self.connection, "sock", None)
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)   # the plain socket's: TLS would send a close first
            except OSError:
                pass


class _Watchdog:
    """One daemon thread per process that cuts the requests past their deadline, and cuts
    them again every few ms until they end (a connection still opening had no socket to shut)."""

    RECUT = 0.05

    def __init__(self):
        self._changed = threading.Condition()
        self._watched: dict[int, _Request] = {}
        threading.Thread(target=self._run, name="aicg-remote-deadlines", daemon=True).start()

    def watch(self, request: _Request) -> None:
        with self._changed:
            self._watched[id(request)] = request
            self._changed.notify()

    def forget(self, request: _Request) -> None:
        with self._changed:
            self._watched.pop(id(request), None)

    def _run(self) -> None:
        with self._changed:
            while True:
                now, waits = time.monotonic(), []
                for request in self._watched.values():
                    left = request.deadline - now
                    if left <= 0:
                        request.cut()
                    waits.append(left if left > 0 else self.RECUT)
                self._changed.wait(min(waits, default=None))


_watchdog: tuple[int, _Watchdog] | None = None
_watchdog_lock = threading.Lock()
_current = threading.local()   # the request this thread has in flight, for the connection to register with


def _process_watchdog() -> _Watchdog:
    """This process's watchdog (a forked child has none of its parent's threads)."""
    global _watchdog
    with _watchdog_lock:
        if _watchdog is None or _watchdog[0] != os.getpid():
            _watchdog = (os.getpid(), _Watchdog())
        return _watchdog[1]


def _after_fork_in_child() -> None:
    global _watchdog_lock
    _watchdog_lock = threading.Lock()   # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Cuttable:
    """A connection that tells the request in flight on its thread that it carries it."""

    def request(self, *args, **kwargs):
        request = getattr(_current, "request", None)
        if request is not None:
            request.connection = self
            if request.cut_off:
                raise urllib3.exceptions.ProtocolError("the request's deadline passed")
        return super().request(*args, **kwargs)


class _Connection(_Cuttable, urllib3.connection.HTTPConnection):
    pass


class _TLSConnection(_Cuttable, urllib3.connection.HTTPSConnection):
    pass


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


# What a try can raise when the server misbehaves: urllib3's errors (refused, reset, timed out,
# a garbled or short answer), and what http.client or the socket raise past them.
_FAILURES = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError, ValueError)


def _reason(err: BaseException) -> str:
    """The innermost cause (urllib3 wraps a refused connection or a half body in errors of its own)."""
    for _ in range(8):
        inner = err.__cause__ or next((a for a in err.args if isinstance(a, BaseException)), None)
        if inner is None:
            break
        err = inner
    text = " ".join(str(err).split())[:200]
    return text if type(err).__name__ in text else f"{type(err).__name__}: {text}".rstrip(": ")


class HttpRemote:
    """GET/HEAD/PUT on <base>/ac/<name> and <base>/cas/<sha256>."""

    def __init__(self, base: str, timeout: float):
        self.base, self.timeout = base.rstrip("/"), timeout
        self.where = self.base
        self._pool: tuple[int, urllib3.HTTPConnectionPool] | None = None

    def _connections(self) -> urllib3.HTTPConnectionPool:
        """This process's pool (a forked child must not talk on its parent's sockets)."""
        if self._pool is None or self._pool[0] != os.getpid():
            try:
                url = urllib3.util.parse_url(self.base)
                pool_class = _TLSPool if url.scheme == "https" else _Pool
                self._pool = (os.getpid(), pool_class(url.host, url.port, maxsize=4, block=False, retries=False))
            except ValueError as err:
                raise Unavailable(f"{self.base} is not a URL of a server: {err}") from None
            self._path = url.path or ""
        return self._pool[1]

    def _request(self, method: str, kind: str, name: str, body: bytes | None = None) -> tuple[int, bytes]:
        pool = self._connections()
        start = time.monotonic()
        request = _Request(start + self.timeout * (1 + len(body or b"") / MiB))
        watchdog = _process_watchdog()
        watchdog.watch(request)
        _current.request = request
        failure, tries = "no answer", 0
        try:
            for pause in PAUSES + (None,):
                tries += 1
                try:
                    status, data = self._try(pool, request, method, f"{kind}/{name}", body)
                except _FAILURES as err:
                    failure = _reason(err)
                else:
                    if status in STORED or (status == 404 and method != "PUT"):
                        return status, data
                    failure = f"HTTP {status}"
                    if status not in TRANSIENT_STATUSES:
                        break
                if pause is None or request.cut_off or time.monotonic() + pause >= request.deadline:
                    break
                time.sleep(pause)
        finally:
            _current.request = None
            watchdog.forget(request)
        if request.cut_off:
            failure = f"no complete answer within {time.monotonic() - start:.1f} s"
        raise Unavailable(f"{method} {kind}/{name}: {failure}" + (f" ({tries} tries)" if tries > 1 else ""))

    def _try(self, pool, request: _Request, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        left = request.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        response = pool.urlopen(method, f"{self._path}/{path}", body=body, timeout=left, retries=False,
                                redirect=False, preload_content=False)
        try:
            pieces = []
            for piece in response.stream(CHUNK):
                pieces.append(piece)
                request.deadline += self.timeout * len(piece) / MiB
            return response.status, b"".join(pieces)
        finally:
            response.release_conn()

    def get(self, kind: str, name: str) -> bytes | None:
        status, body = self._request("GET", kind, name)
        return body if status == 200 else None

    def has(self, kind: str, name: str) -> bool:
        """Whether the remote holds `name`; for content, whether it holds the right bytes
        (a writer relies on the blobs its entries name, so a wrong one is to be replaced)."""
        if kind == "cas":
            return _holds(self.get(kind, name), name)
        return self._request("HEAD", kind, name)[0] == 200

    def put(self, kind: str, name: str, data: bytes) -> None:
        self._request("PUT", kind, name, data)


def connect(where: str, timeout: float):
    return HttpRemote(where, timeout) if where.startswith(("http://", "https://")) else DirRemote(where)
