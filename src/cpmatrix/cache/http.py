"""A remote result cache on Bazel's HTTP cache protocol (bazel-remote, nginx WebDAV, ...).

The server needs nothing but ``GET``, ``HEAD`` and ``PUT`` on two kinds of keys, under
an optional instance prefix (the URL's path):

- ``/cas/<sha256>``: a blob, named by the sha256 of its bytes;
- ``/ac/<key>``: an action result, a real ``ActionResult`` protobuf
  (:mod:`cpmatrix.cache.reapi`) whose output files name blobs in the CAS.

An action's outputs go to the CAS first and its ``ActionResult`` last, so a reader never
meets an entry whose blobs are not there yet. On a hit every blob is checked against
its digest (hash and size) before use: a mismatch, a missing blob or an entry that does
not parse is a *miss*, counted and reported, never a result.

**It never fails a run, nor holds it up.** Each request has a *total* deadline
(``timeout_s``, 10 s: connecting, sending and the whole answer, however slowly it
trickles in; a watchdog shuts the socket at the deadline) and a size cap on the answer
(``max_bytes``: a ``Content-Length`` over it is refused before any body is read). The
first request that misses its deadline, a transport error, an answer that is not HTTP,
an answer over the cap, a redirect (never followed), a 5xx, 401/403 or any other
unexpected status warns once (naming the URL without credentials) and switches the
remote off for the rest of the run: every request then in flight is cut at once, and
every later call returns at once. :meth:`RemoteCache.wait` bounds a whole phase (all
the lookups; the wait for the uploads after the run) by one deadline the same way. A 404 is an
ordinary miss. Two writers of one key write the same bytes (the key is a content digest
of everything the result depends on), and servers replace a key atomically, so
concurrent writers are harmless.

**Credentials** never come from the command line or land in a report: a URL holding
``user:password@`` is refused (it would be printed and logged). They come from the
environment (``CPMATRIX_REMOTE_CACHE_TOKEN``: an ``Authorization: Bearer`` token) or a
netrc-style file (``$NETRC``, else ``~/.netrc``: ``machine HOST login USER password
PASS``, sent as HTTP Basic). TLS is used when the URL says ``https``, verified against
the system's CAs (``SSL_CERT_FILE`` names another bundle, as for any OpenSSL client).

Example::

    >>> settings = RemoteSettings.parse("https://cache.example.com:8443/cpmatrix")
    >>> settings.display, settings.prefix
    ('https://cache.example.com:8443/cpmatrix', '/cpmatrix')
    >>> try:
    ...     RemoteSettings.parse("http://me:secret@host/")
    ... except UsageError as exc:
    ...     print(str(exc)[:48])
    --remote-cache: the URL holds credentials, which
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import netrc
import os
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from cpmatrix.cache.reapi import ActionResult, Digest, OutputFile
from cpmatrix.errors import UsageError

__all__ = ["TOKEN_ENV", "RemoteCache", "RemoteSettings", "RemoteStats"]

#: The environment variable holding a bearer token for the cache server.
TOKEN_ENV = "CPMATRIX_REMOTE_CACHE_TOKEN"
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteSettings:
    """Where the remote cache is and how to talk to it (validated once, at parse time)."""

    scheme: str
    host: str
    port: int
    #: The instance prefix: the URL's path without its trailing slash ("" for none).
    prefix: str = ""
    #: Read hits, never write (untrusted clients: pull-request builds).
    read_only: bool = False
    #: Seconds one request may take in all: connecting, sending, the whole answer.
    timeout_s: float = 10.0
    #: The largest answer read (an entry is a small JSON document and its logs).
    max_bytes: int = 64 * 2**20

    @classmethod
    def parse(cls, url: str, *, read_only: bool = False, timeout_s: float = 10.0,
              max_bytes: int = 64 * 2**20, option: str = "--remote-cache",
              ) -> RemoteSettings:
        """Check ``url`` (``http(s)://host[:port][/prefix]``); UsageError (exit 2) if bad."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https"):
            raise UsageError(f"{option}: {url!r} is not an http:// or https:// URL")
        if parts.username is not None or parts.password is not None:
            raise UsageError(f"{option}: the URL holds credentials, which would be printed "
                             f"and logged; put them in ${TOKEN_ENV} or a netrc file "
                             "(docs/cache.md)")
        if not parts.hostname:
            raise UsageError(f"{option}: {url!r} names no host")
        if parts.query or parts.fragment:
            raise UsageError(f"{option}: {url!r}: a cache URL has no ?query or #fragment")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise UsageError(f"{option}: {url!r} has an invalid port") from None
        if not timeout_s > 0:
            raise UsageError(f"{option}: the timeout must be > 0 seconds, got {timeout_s}")
        if max_bytes < 1:
            raise UsageError(f"{option}: the size cap must be >= 1 byte, got {max_bytes}")
        return cls(scheme=parts.scheme, host=parts.hostname, port=port,
                   prefix=parts.path.rstrip("/"), read_only=read_only, timeout_s=timeout_s,
                   max_bytes=max_bytes)

    @property
    def display(self) -> str:
        """The URL as printed and recorded (it never holds credentials)."""
        default = 443 if self.scheme == "https" else 80
        port = "" if self.port == default else f":{self.port}"
        return f"{self.scheme}://{self.host}{port}{self.prefix}"


@dataclass
class RemoteStats:
    """What the remote did in one run (printed at the end, recorded in run.json)."""

    hits: int = 0
    misses: int = 0
    #: Entries present but unusable (a blob missing or not matching its digest).
    corrupt: int = 0
    #: Entries whose blobs verified, but whose observed set differs here (misses).
    stale: int = 0
    uploads: int = 0
    #: The error that switched the remote off, if any.
    disabled: str = ""
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        line = (f"{self.hits} hits, {self.misses} misses ({self.corrupt} failed "
                f"verification, {self.stale} read other files), {self.uploads} uploads")
        return line + (f"; off after: {self.disabled}" if self.disabled else "")


class _Unavailable(Exception):
    """The server cannot be used (transport error, 5xx, 401/403, odd status)."""


def _auth_header(host: str, env: Mapping[str, str]) -> str | None:
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        return f"Bearer {token}"
    path = env.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        found = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    if not found:
        return None
    login, _account, password = found
    raw = f"{login or ''}:{password or ''}".encode()
    return "Basic " + base64.b64encode(raw).decode()


class RemoteCache:
    """An HTTP client for one cache server; safe to call from several threads.

    ``warn`` receives the one warning printed when the remote is switched off.
    """

    def __init__(self, settings: RemoteSettings, *, env: Mapping[str, str] | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.stats = RemoteStats()
        self._auth = _auth_header(settings.host, os.environ if env is None else env)
        self._warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
        self._local = threading.local()
        self._lock = threading.Lock()
        #: Every thread's connection, so :meth:`close` can close them all.
        self._open: list[http.client.HTTPConnection] = []

    def close(self) -> None:
        """Close the keep-alive connections (the client stays usable: it reconnects)."""
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    def __enter__(self) -> RemoteCache:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def enabled(self) -> bool:
        return not self.stats.disabled

    # ------------------------------------------------------------ transport
    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            s = self.settings
            if s.scheme == "https":
                conn = http.client.HTTPSConnection(s.host, s.port, timeout=s.timeout_s,
                                                   context=ssl.create_default_context())
            else:
                conn = http.client.HTTPConnection(s.host, s.port, timeout=s.timeout_s)
            self._local.conn = conn
            with self._lock:
                self._open.append(conn)
        return conn

    def _request(self, method: str, path: str, body: bytes | None = None,
                 ) -> tuple[int, bytes, str]:
        """One request (reconnecting once on a dropped keep-alive connection): its status,
        its body and its ``Location`` header; :class:`_Unavailable` past the deadline."""
        headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
        if self._auth:
            headers["Authorization"] = self._auth
        deadline = time.monotonic() + self.settings.timeout_s
        for attempt in (1, 2):
            if not self.enabled:  # went off in another thread meanwhile
                raise _Unavailable(self._late())
            conn = self._connection()
            watchdog = _Watchdog(conn, deadline)
            try:
                conn.request(method, self.settings.prefix + path, body=body, headers=headers)
                response = conn.getresponse()
                data = self._body(response)
                if watchdog.cancel():
                    raise _Unavailable(self._late())
                return response.status, data, response.getheader("Location") or ""
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError) as exc:
                self._drop(conn)
                if watchdog.cancel():
                    raise _Unavailable(self._late()) from None
                if attempt == 2:
                    raise _Unavailable(f"{type(exc).__name__}: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                if watchdog.cancel():
                    raise _Unavailable(self._late()) from None
                raise _Unavailable(f"{type(exc).__name__}: {exc}") from None
            except _Unavailable:
                self._drop(conn)
                watchdog.cancel()
                raise
        raise AssertionError("unreachable")

    def _late(self) -> str:
        if not self.enabled:  # cut because the remote went off meanwhile
            return f"cut: the remote went off ({self.stats.disabled})"
        return f"no complete answer within the deadline ({self.settings.timeout_s:g} s)"

    def _body(self, response: http.client.HTTPResponse) -> bytes:
        """The answer's body, refused past ``max_bytes`` (announced or read)."""
        cap = self.settings.max_bytes
        length = response.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > cap:
            raise _Unavailable(f"an answer of {int(length)} bytes, over the cap of {cap}")
        chunks, size = [], 0
        while chunk := response.read(min(1 << 16, cap + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                raise _Unavailable(f"an answer of more than {cap} bytes (the cap)")
        return b"".join(chunks)

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None

    def _off(self, why: str) -> None:
        with self._lock:
            if self.stats.disabled:
                return
            self.stats.disabled = why
            conns = list(self._open)
        for conn in conns:  # requests in flight in other threads end now, not at their
            _shut(conn)     # deadline: the run waits for none of them
        self._warn(f"remote cache {self.settings.display}: {why}; going on with the local "
                   "cache only for the rest of this run")

    def wait(self, futures: Sequence[Future[Any]], what: str,
             timeout: float | None = None) -> None:
        """Wait for ``futures`` (requests in threads) at most ``timeout`` seconds (default:
        one request's deadline); past it the remote goes off, which ends them at once."""
        limit = self.settings.timeout_s if timeout is None else timeout
        if futures:
            _, pending = wait(futures, timeout=limit)
            if pending:
                self._off(f"{what} not finished within the deadline ({limit:g} s)")

    def _call(self, method: str, path: str, body: bytes | None = None) -> bytes | None:
        """The body of a 2xx answer; None for 404 (and after the remote went off)."""
        if not self.enabled:
            return None
        try:
            status, data, location = self._request(method, path, body)
        except _Unavailable as exc:
            self._off(str(exc))
            return None
        if 200 <= status < 300:
            return data
        if status == 404:
            return None
        if 300 <= status < 400:
            where = f" to {location[:200]}" if location else ""
            why = f"HTTP {status} on {method}: a redirect{where}, not followed"
        else:
            why = {401: "401 Unauthorized (credentials: docs/cache.md)",
                   403: "403 Forbidden (is this client allowed to write? use "
                        "--remote-cache-read-only)"}.get(status, f"HTTP {status} on {method}")
        self._off(why)
        return None

    # ------------------------------------------------------------------ CAS
    def put_blob(self, data: bytes) -> Digest | None:
        """Store ``data`` under its sha256 (skipped when the server has it); its digest."""
        digest = Digest(hashlib.sha256(data).hexdigest(), len(data))
        path = f"/cas/{digest.hash}"
        if self._call("HEAD", path) is not None:
            return digest
        return digest if self._call("PUT", path, data) is not None else None

    def get_blob(self, digest: Digest) -> bytes | None:
        """The blob's bytes, checked against ``digest``; None when missing or wrong."""
        if not _is_sha256(digest.hash):
            return None
        data = self._call("GET", f"/cas/{digest.hash}")
        if data is None:
            return None
        if len(data) != digest.size_bytes or hashlib.sha256(data).hexdigest() != digest.hash:
            return None
        return data

    # ------------------------------------------------------------------- AC
    def get_action(self, key: str) -> dict[str, bytes] | None:
        """The outputs stored for action ``key`` (path -> bytes, every blob verified);
        None on a miss, a corrupt entry (counted, noted) or with the remote off."""
        if not _is_sha256(key):
            raise ValueError(f"action key must be a sha256 hex digest, got {key!r}")
        raw = self._call("GET", f"/ac/{key}")
        if raw is None:
            if self.enabled:
                self._count("misses")
            return None
        try:
            result = ActionResult.decode(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            self._corrupt(key, f"the action entry does not parse ({exc})")
            return None
        if result.exit_code != 0 or not result.outputs:
            self._corrupt(key, "the action entry is not a stored pass")
            return None
        outputs: dict[str, bytes] = {}
        for f in result.outputs:
            data = self.get_blob(f.digest)
            if data is None:
                if self.enabled:
                    self._corrupt(key, f"blob {f.path} ({f.digest.hash[:12]}) is missing "
                                  "or does not match its digest")
                return None
            outputs[f.path] = data
        self._count("hits")
        return outputs

    def put_action(self, key: str, outputs: Mapping[str, bytes]) -> bool:
        """Store ``outputs`` (path -> bytes) as action ``key``: blobs first, the entry
        last. False when read-only, off, or any request failed (nothing half-visible)."""
        if self.settings.read_only or not self.enabled:
            return False
        if not _is_sha256(key):
            raise ValueError(f"action key must be a sha256 hex digest, got {key!r}")
        files = []
        for path, data in sorted(outputs.items()):
            digest = self.put_blob(data)
            if digest is None:
                return False
            files.append(OutputFile(path, digest))
        if self._call("PUT", f"/ac/{key}", ActionResult(tuple(files)).encode()) is None:
            return False
        self._count("uploads")
        return True

    def reject(self, key: str, why: str) -> None:
        """Count a hit of :meth:`get_action` as a miss after all: its entry verified, but
        does not hold for this checkout (``why``: the file that differs)."""
        with self._lock:
            self.stats.hits -= 1
            self.stats.misses += 1
            self.stats.stale += 1
            self.stats.notes.append(f"{key[:16]}: {why}")

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)

    def _corrupt(self, key: str, why: str) -> None:
        with self._lock:
            self.stats.corrupt += 1
            self.stats.misses += 1
            self.stats.notes.append(f"{key[:16]}: {why}")
        return None


def _shut(conn: http.client.HTTPConnection) -> None:
    """End whatever ``conn`` is waiting for, from any thread: a blocked read returns."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Watchdog:
    """Shuts ``conn`` at ``deadline`` (monotonic) unless cancelled first: a request's
    total deadline, whatever the server sends or withholds."""

    def __init__(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        self.fired = False
        self._conn = conn
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        _shut(self._conn)

    def cancel(self) -> bool:
        """Stop the watch; whether the deadline had already cut the request."""
        self._timer.cancel()
        return self.fired


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and set(text) <= _HEX
