"""The remote cache client against a real nginx WebDAV server (Bazel's HTTP cache protocol).

Each test owns its server (a folder and a port of its own), so it can tamper with the
stored files, stop the server or demand credentials.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cache_server_fixture import serve
from cpmatrix.cache.http import TOKEN_ENV, RemoteCache, RemoteSettings
from cpmatrix.cache.reapi import ActionResult
from cpmatrix.errors import UsageError

KEY = hashlib.sha256(b"an action").hexdigest()
OUTPUTS = {"cpmatrix/entry.json": b'{"result": "passed"}',
           "cpmatrix/logs/rank0.log": b"rank 0 said hello\n"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Any]:
    yield from serve(tmp_path / "server")


_CLIENTS: list[RemoteCache] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def _client(server: Any, *, read_only: bool = False, env: dict[str, str] | None = None,
            prefix: str = "", warnings: list[str] | None = None,
            timeout_s: float = 5.0) -> RemoteCache:
    settings = RemoteSettings.parse(server.url + prefix, read_only=read_only,
                                    timeout_s=timeout_s)
    sink = warnings if warnings is not None else []
    client = RemoteCache(settings, env=env or {}, warn=sink.append)
    _CLIENTS.append(client)
    return client


def _data(server: Any) -> Path:
    return Path(server.root) / "data"


def test_an_action_stored_is_read_back_with_every_blob_verified(server: Any) -> None:
    writer = _client(server, prefix="/inst")
    assert writer.put_action(KEY, OUTPUTS)
    # Bazel's layout under the instance prefix: the entry under ac/, blobs under cas/.
    entry = _data(server) / "inst" / "ac" / KEY
    assert entry.is_file()
    parsed = ActionResult.decode(entry.read_bytes())
    for f in parsed.outputs:
        assert (_data(server) / "inst" / "cas" / f.digest.hash).read_bytes() == OUTPUTS[f.path]
    reader = _client(server, prefix="/inst")
    assert reader.get_action(KEY) == OUTPUTS
    assert (reader.stats.hits, reader.stats.misses, reader.stats.corrupt) == (1, 0, 0)
    # Another instance prefix is another cache.
    other = _client(server, prefix="/other")
    assert other.get_action(KEY) is None and other.stats.misses == 1


def test_a_tampered_blob_is_a_miss_not_a_result(server: Any) -> None:
    client = _client(server)
    assert client.put_action(KEY, OUTPUTS)
    digest = hashlib.sha256(OUTPUTS["cpmatrix/entry.json"]).hexdigest()
    # Same length, other bytes: only the hash can tell.
    (_data(server) / "cas" / digest).write_bytes(b'{"result": "failed"}')
    reader = _client(server)
    assert reader.get_action(KEY) is None
    assert (reader.stats.hits, reader.stats.corrupt) == (0, 1)
    assert "does not match its digest" in reader.stats.notes[0]
    assert reader.enabled, "a corrupt entry is a miss, not a reason to stop using the cache"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing blob"])
def test_a_damaged_entry_is_a_miss(server: Any, damage: str) -> None:
    client = _client(server)
    assert client.put_action(KEY, OUTPUTS)
    entry = _data(server) / "ac" / KEY
    if damage == "truncate":
        entry.write_bytes(entry.read_bytes()[:-7])
    elif damage == "garbage":
        entry.write_bytes(b"\xff" * 40)
    else:
        for blob in (_data(server) / "cas").iterdir():
            blob.unlink()
            break
    reader = _client(server)
    assert reader.get_action(KEY) is None
    assert reader.stats.corrupt == 1 and reader.stats.hits == 0


def test_read_only_never_writes(server: Any) -> None:
    client = _client(server, read_only=True)
    assert not client.put_action(KEY, OUTPUTS)
    assert not any(_data(server).rglob("*")), "a read-only client wrote to the server"
    access = (Path(server.root) / "access.log").read_text()
    assert "PUT" not in access and "HEAD" not in access


def test_a_stopped_server_warns_once_and_the_remote_goes_off(server: Any) -> None:
    warnings: list[str] = []
    client = _client(server, warnings=warnings, timeout_s=2.0)
    assert client.put_action(KEY, OUTPUTS)
    server.stop()
    assert client.get_action(KEY) is None
    assert not client.put_action(KEY, OUTPUTS)
    assert client.get_action(KEY) is None
    assert len(warnings) == 1, warnings
    assert server.url in warnings[0] and "local cache only" in warnings[0]
    assert not client.enabled


def test_concurrent_writers_of_one_key_leave_a_valid_entry(server: Any) -> None:
    clients = [_client(server) for _ in range(6)]
    threads = [threading.Thread(target=c.put_action, args=(KEY, OUTPUTS)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(c.enabled for c in clients)
    assert _client(server).get_action(KEY) == OUTPUTS


# ------------------------------------------------------------------ credentials and TLS


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Any]:
    yield from serve(tmp_path / "guarded", basic_auth="ci:s3cret")


def test_without_credentials_a_guarded_server_is_off_with_a_clear_warning(guarded: Any) -> None:
    warnings: list[str] = []
    client = _client(guarded, warnings=warnings)
    assert client.get_action(KEY) is None
    assert len(warnings) == 1 and "401 Unauthorized" in warnings[0]


def _netrc(tmp_path: Path, password: str) -> dict[str, str]:
    """The environment naming a netrc file that gives user ``ci`` this password."""
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login ci password {password}\n")
    netrc.chmod(0o600)
    return {"NETRC": str(netrc)}


def test_netrc_credentials_are_used_and_never_shown(guarded: Any, tmp_path: Path) -> None:
    warnings: list[str] = []
    client = _client(guarded, env=_netrc(tmp_path, "s3cret"), warnings=warnings)
    assert client.put_action(KEY, OUTPUTS)
    assert client.get_action(KEY) == OUTPUTS
    assert warnings == []
    assert "s3cret" not in client.settings.display


def test_a_wrong_password_is_off_not_a_crash(guarded: Any, tmp_path: Path) -> None:
    warnings: list[str] = []
    client = _client(guarded, env=_netrc(tmp_path, "wrong"), warnings=warnings)
    assert not client.put_action(KEY, OUTPUTS)
    assert "401" in warnings[0] and "wrong" not in warnings[0]


def test_a_token_goes_in_an_authorization_header(server: Any) -> None:
    client = _client(server, env={TOKEN_ENV: "tok-123"})
    assert client.put_action(KEY, OUTPUTS)
    # nginx logs no headers by default: the token never reaches a log either.
    assert "tok-123" not in (Path(server.root) / "access.log").read_text()
    assert client._auth == "Bearer tok-123"


def test_credentials_in_the_url_are_refused() -> None:
    with pytest.raises(UsageError, match="holds credentials"):
        RemoteSettings.parse("https://ci:s3cret@cache.example.com/x")


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[Any]:
    yield from serve(tmp_path / "tls", tls=True)


def test_https_is_verified(tls_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    warnings: list[str] = []
    untrusted = _client(tls_server, warnings=warnings)
    assert not untrusted.put_action(KEY, OUTPUTS)
    assert "CERTIFICATE_VERIFY_FAILED" in warnings[0]
    # Trusting the server's certificate as any OpenSSL client does: SSL_CERT_FILE.
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.cert))
    trusted = _client(tls_server)
    assert trusted.put_action(KEY, OUTPUTS) and trusted.get_action(KEY) == OUTPUTS


@pytest.mark.parametrize(("url", "why"), [
    ("ftp://host/x", "not an http"),
    ("http:///x", "names no host"),
    ("http://host:99999/", "invalid port"),
    ("http://host/x?y=1", "no ?query"),
])
def test_bad_urls_are_usage_errors(url: str, why: str) -> None:
    with pytest.raises(UsageError, match=why.replace("?", r"\?")):
        RemoteSettings.parse(url)
