"""Real servers on loopback for the remote-store tests: nginx with WebDAV PUT
(its access log tells the connections a build opened), a listener that accepts connections and never answers, and a small HTTP/1.1
server of our own that serves a directory and misbehaves on the requests it is
told to."""
from __future__ import annotations

import http.server
import os
import select
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ }}
http {{
  log_format connections '$connection $connection_requests $request_method $status $msec $request_time $request_length $bytes_sent';
  access_log {root}/access.log connections;
  client_body_temp_path {root}/body;
  proxy_temp_path {root}/proxy;
  fastcgi_temp_path {root}/fastcgi;
  uwsgi_temp_path {root}/uwsgi;
  scgi_temp_path {root}/scgi;
  server {{
    listen 127.0.0.1:{port};
    root {root}/www;
    client_max_body_size 64m;
    location / {{
      dav_methods PUT DELETE;
      create_full_put_path on;
      dav_access user:rw group:r all:r;
    }}
  }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


class Nginx:
    def __init__(self, root: Path):
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(binary):
            if os.environ.get("AICG_REQUIRE_NGINX"):
                pytest.fail("nginx is not installed (apt-get install nginx)")
            pytest.skip("nginx is not installed")
        self.root, self.port = root, free_port()
        (root / "www").mkdir(parents=True)
        conf = root / "nginx.conf"
        conf.write_text(NGINX_CONF.format(root=root, port=self.port, user="user root;" if os.geteuid() == 0 else ""))
        self.process = subprocess.Popen([binary, "-p", str(root), "-c", str(conf), "-e", str(root / "error.log")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_for(self.port)
        self.url = f"http://127.0.0.1:{self.port}/aicg"
        self.files = root / "www/aicg"

    def connections(self) -> tuple[int, int]:
        """(connections accepted, requests answered) so far, from the access log."""
        log = self.root / "access.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return len({line.split()[0] for line in lines}), len(lines)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


class Silent:
    """Accepts connections and never says a word: a remote that is slow past any timeout."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/aicg"
        self.held: list[socket.socket] = []
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.running:
            try:
                connection, _ = self.socket.accept()
                self.held.append(connection)
            except OSError:
                return

    def stop(self) -> None:
        self.running = False
        self.socket.close()
        for c in self.held:
            c.close()


FAULTS = ("garbage status line", "half a body", "trickle", "reset", "hang up", "503")


class Misbehaving:
    """Serves GET/HEAD/PUT on `root` (the ac/ and cas/ folders of a shared directory) with
    keep-alive, counting the connections it accepts and the requests it reads, and answers
    request n (from 1) with the fault `fault(n)` names (one of FAULTS; None: properly):

    garbage status line   a line that is not HTTP, then the connection closed
    half a body           200 with Content-Length N and N/2 bytes, then closed
    trickle               a proper answer, one byte every `trickle_gap` s (each read is quick,
                          the whole answer is not); after `trickle_limit` s of trickling in
                          all, the rest at once, so that a client that waits is not held for ever
    reset                 the connection reset (RST) without an answer
    hang up               the connection closed (FIN) without an answer, as a server closing
                          an idle keep-alive connection does just as the client reuses it
    503                   Service Unavailable, the connection kept
    """

    def __init__(self, root: Path, fault: Callable[[int], str | None] = lambda n: None,
                 trickle_gap: float = 0.1, trickle_limit: float = 10.0):
        self.root, self.fault = Path(root), fault
        self.trickle_gap, self.trickle_limit = trickle_gap, trickle_limit
        self.connections = self.requests = 0
        self.trickle_since: float | None = None
        self.held: list[float] = []          # seconds each trickled answer kept its client
        self.faults_done: list[str] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(_Handler):
            server_state = outer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/aicg"
        self.running = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.running = False
        self.server.shutdown()
        self.server.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"        # keep-alive unless a fault closes the connection
    server_state: Misbehaving

    def setup(self) -> None:
        super().setup()
        with self.server_state.lock:
            self.server_state.connections += 1

    def log_message(self, *args) -> None:
        pass

    def _file(self) -> Path | None:
        parts = self.path.split("/")          # /aicg/<kind>/<name>
        if len(parts) != 4 or parts[2] not in ("ac", "cas") or not parts[3].isalnum():
            return None
        return self.server_state.root / parts[2] / parts[3]

    def _answer(self, method: str) -> None:
        state = self.server_state
        with state.lock:
            state.requests += 1
            fault = state.fault(state.requests)
            if fault:
                state.faults_done.append(fault)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "PUT" else b""
        path = self._file()
        if fault is None and method == "PUT" and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + f".{threading.get_ident()}.tmp")
            tmp.write_bytes(body)
            tmp.replace(path)
            status, data = 201, b""
        elif path is not None and path.is_file():
            status, data = 200, path.read_bytes()
        else:
            status, data = 404, b""
        head = (f"HTTP/1.1 {status} {'OK' if status < 400 else 'Not Found'}\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        payload = head + (b"" if method in ("HEAD", "PUT") else data)
        if fault is None:
            self.wfile.write(payload)
            return
        self.close_connection = True
        if fault == "garbage status line":
            self.wfile.write(b"SPAM SPAM SPAM\r\n\r\n")
        elif fault == "half a body":
            declared = max(len(data), 1000)
            self.wfile.write(f"HTTP/1.1 200 OK\r\nContent-Length: {declared}\r\n\r\n".encode())
            self.wfile.write((data or b"x" * declared)[:declared // 2])
        elif fault == "trickle":
            start = time.monotonic()
            with state.lock:
                state.trickle_since = state.trickle_since or start
            try:
                for i in range(len(payload)):
                    if not state.running or time.monotonic() - state.trickle_since > state.trickle_limit:
                        self.wfile.write(payload[i:])
                        break
                    self.wfile.write(payload[i:i + 1])
                    if select.select([self.connection], [], [], state.trickle_gap)[0]:
                        break                # the client hung up (it has nothing more to send)
            except OSError:                  # the client reset the connection
                pass
            with state.lock:
                state.held.append(time.monotonic() - start)
        elif fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        elif fault == "hang up":
            pass
        elif fault == "503":
            self.close_connection = False
            self.wfile.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
        else:
            raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")

    def do_GET(self) -> None:
        self._answer("GET")

    def do_HEAD(self) -> None:
        self._answer("HEAD")

    def do_PUT(self) -> None:
        self._answer("PUT")
