"""nginx on 127.0.0.1 serving a directory, for the Python tests of URL loads and for
bench/bench_collective.py. Needs the `nginx` binary (`apt-get install nginx-light`): a missing one
is an error naming that command, never a skip."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

# How long nginx may take to listen.
READY_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """`with Nginx(root) as n: n.url("model/")`: serves `root` read-only on a free port (or
    `port`), HTTP/1.1 with keep-alive, ranges, ETag and Last-Modified (nginx's static module).
    `host` and `launcher` serve from elsewhere: e.g. inside a network namespace
    (`launcher=["ip", "netns", "exec", NAME]`, `host` its address: bench_tp_storage.py)."""

    def __init__(self, root: Path, port: int = 0, host: str = "127.0.0.1", launcher: Sequence[str] = ()):
        self.root = Path(root).resolve()
        self.host = host
        self.launcher = list(launcher)
        self.port = port or free_port()
        self._work = None
        self._proc = None

    def url(self, path: str = "") -> str:
        return f"http://{self.host}:{self.port}/{path}"

    def __enter__(self) -> "Nginx":
        if shutil.which("nginx") is None:
            raise RuntimeError("nginx is not installed: apt-get install -y nginx-light")
        self._work = Path(tempfile.mkdtemp(prefix="tensora-nginx-"))
        w = self._work
        # Started as root, nginx's workers would drop to `nobody`, who cannot read a private
        # temporary directory: keep the workers as the user running the tests.
        user = "user root;" if os.geteuid() == 0 else ""
        (w / "nginx.conf").write_text(f"""
daemon off;
{user}
worker_processes 2;
pid {w}/nginx.pid;
error_log {w}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    client_body_temp_path {w}/body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    server {{
        listen {self.host}:{self.port};
        root {self.root};
    }}
}}
""")
        self._proc = subprocess.Popen([*self.launcher, "nginx", "-c", str(w / "nginx.conf"), "-p", str(w)],
                                      stderr=subprocess.PIPE)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode()[-2000:]
                self._cleanup()
                raise RuntimeError(f"nginx exited before listening on {self.port}: {err}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self._cleanup()
        raise RuntimeError(f"nginx did not listen on {self.host}:{self.port} within {READY_TIMEOUT_S} s")

    def __exit__(self, *exc) -> None:
        self._cleanup()

    def _cleanup(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
