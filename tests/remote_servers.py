"""Real servers on loopback for the remote-store tests: nginx with WebDAV PUT,
and a listener that accepts connections and never answers."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ }}
http {{
  access_log off;
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
