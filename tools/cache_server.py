"""A real HTTP remote cache on this machine: nginx (Debian's package) with WebDAV PUT.

    python tools/cache_server.py --root /var/tmp/cpmatrix-cache --port 8765   # foreground
    python tools/cache_server.py --root DIR --port 8765 --daemon              # .ci/cache-up

Bazel's HTTP cache protocol needs nothing but GET, HEAD and PUT on ``/ac/<key>`` and
``/cas/<sha256>`` under an optional instance prefix: nginx's ``dav_methods PUT`` with
``create_full_put_path`` is a complete server (Bazel's docs list nginx WebDAV as a
backend). nginx writes a PUT body to a temporary file and renames it into place, so
concurrent writers of one key never leave half a file.

Options for the tests of the client's trust model: ``--basic-auth USER:PASSWORD`` (an
htpasswd file; 401 without credentials) and ``--tls`` (a self-signed certificate made
with ``openssl``, written to ``ROOT/tls/cert.pem`` for clients to trust).

The tests import :func:`start` (tests/unit and tests/e2e load this file by path).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


@dataclass(frozen=True, slots=True)
class Server:
    """A running nginx: its URL, folder and pid."""

    url: str
    root: Path
    pid: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def cert(self) -> Path:
        return self.root / "tls" / "cert.pem"

    def stop(self) -> None:
        """Stop nginx (master and workers) and wait for it."""
        try:
            os.kill(self.pid, signal.SIGQUIT if self.process is None else signal.SIGTERM)
        except ProcessLookupError:
            return
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            return
        for _ in range(100):
            if not Path(f"/proc/{self.pid}").exists():
                return
            time.sleep(0.05)


def available() -> bool:
    return os.access(NGINX, os.X_OK)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _htpasswd(user: str, password: str) -> str:
    """An htpasswd line nginx accepts ({SHA}: base64 of the SHA-1; test servers only)."""
    digest = base64.b64encode(hashlib.sha1(password.encode()).digest()).decode()
    return f"{user}:{{SHA}}{digest}\n"


def _self_signed(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")],
        check=True, capture_output=True)


def config(root: Path, port: int, *, auth: bool, tls: bool, daemon: bool) -> str:
    """nginx.conf for a cache under ``root/data`` on 127.0.0.1:``port``."""
    listen = f"127.0.0.1:{port}" + (" ssl" if tls else "")
    lines = [
        f"daemon {'on' if daemon else 'off'};",
        # As root, workers would run as nobody and could not write root's temp folders.
        "user root;" if os.geteuid() == 0 else "",
        "worker_processes 1;",
        f"pid {root}/nginx.pid;",
        f"error_log {root}/error.log warn;",
        "events { worker_connections 256; }",
        "http {",
        f"  access_log {root}/access.log;",
        f"  client_body_temp_path {root}/tmp;",
        f"  proxy_temp_path {root}/tmp; fastcgi_temp_path {root}/tmp;",
        f"  uwsgi_temp_path {root}/tmp; scgi_temp_path {root}/tmp;",
        "  server {",
        f"    listen {listen};",
        f"    root {root}/data;",
        "    client_max_body_size 1g;",
        "    dav_methods PUT;",
        "    create_full_put_path on;",
        "    dav_access user:rw group:rw all:r;",
    ]
    if tls:
        lines += [f"    ssl_certificate {root}/tls/cert.pem;",
                  f"    ssl_certificate_key {root}/tls/key.pem;"]
    if auth:
        lines += ['    auth_basic "cpmatrix cache";', f"    auth_basic_user_file {root}/htpasswd;"]
    lines += ["  }", "}"]
    return "\n".join(line for line in lines if line) + "\n"


def start(root: Path, port: int | None = None, *, basic_auth: str | None = None,
          tls: bool = False, daemon: bool = False) -> Server:
    """Start nginx serving ``root/data``; returns once it answers on its port."""
    port = port or free_port()
    root = root.resolve()
    for sub in ("data", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    if basic_auth is not None:
        user, _, password = basic_auth.partition(":")
        (root / "htpasswd").write_text(_htpasswd(user, password))
    if tls:
        _self_signed(root / "tls")
    conf = root / "nginx.conf"
    conf.write_text(config(root, port, auth=basic_auth is not None, tls=tls, daemon=daemon))
    argv = [NGINX, "-c", str(conf), "-p", str(root), "-e", str(root / "error.log")]
    process = None
    if daemon:
        subprocess.run(argv, check=True)
    else:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if (process is not None and process.poll() is not None) or \
                    time.monotonic() > deadline:
                log = (root / "error.log").read_text(errors="replace")[-2000:] \
                    if (root / "error.log").exists() else ""
                raise RuntimeError(f"nginx did not start on port {port}: {log}") from None
            time.sleep(0.05)
    pid = int((root / "nginx.pid").read_text().split()[0]) if daemon else process.pid  # type: ignore[union-attr]
    scheme = "https" if tls else "http"
    return Server(url=f"{scheme}://127.0.0.1:{port}", root=root, pid=pid, process=process)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="folder for data, config, logs")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--basic-auth", metavar="USER:PASSWORD", default=None)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--daemon", action="store_true", help="start in the background and exit")
    args = ap.parse_args(argv)
    if not available():
        print(f"cache_server: no nginx at {NGINX} (apt-get install nginx)", file=sys.stderr)
        return 2
    server = start(args.root, args.port, basic_auth=args.basic_auth, tls=args.tls,
                   daemon=args.daemon)
    print(server.url, flush=True)
    if not args.daemon:
        try:
            assert server.process is not None
            server.process.wait()
        except KeyboardInterrupt:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
