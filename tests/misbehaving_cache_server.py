"""A cache server on loopback that misbehaves on purpose (the remote cache's deadline tests).

A small asyncio server in a thread of the test process; each mode answers every request
(or only the reads, or only the writes) one bad way:

| mode | answer |
|---|---|
| ``trickle`` | ``200`` with ``Content-Length: 1000``, then one byte every 2 s |
| ``trickle-head`` | the status line and headers themselves, one byte every 2 s |
| ``stall`` | reads the request, never answers, keeps the connection open |
| ``garbage`` | bytes that are not HTTP, then closes |
| ``redirect-301`` / ``-302`` / ``-307`` | a redirect to another server (a dead port) |
| ``error-500`` / ``error-503`` | the server error, with a body |
| ``huge`` | ``200`` announcing a body bigger than any cap (1 TB), then a few bytes, then stalls |
| ``flood`` | ``200`` without a length, an endless stream of bytes as fast as it can |
| ``trickle-writes`` | reads (``GET``) miss at once (``404``); ``HEAD``/``PUT`` trickle |

Example::

    with MisbehavingServer("stall") as server:
        url = server.url          # http://127.0.0.1:PORT/prefix
        ...
        server.requests           # how many requests it has read
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType

MODES = ("trickle", "trickle-head", "stall", "garbage", "redirect-301", "redirect-302",
         "redirect-307", "error-500", "error-503", "huge", "flood", "trickle-writes")

_Writer = asyncio.StreamWriter


class MisbehavingServer:
    """One misbehaving server on 127.0.0.1 (an ephemeral port), for a ``with`` block."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (allowed: {', '.join(MODES)})")
        self.mode = mode
        self.requests = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, name=f"bad-cache-{mode}",
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/prefix"

    def __enter__(self) -> MisbehavingServer:
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError("the misbehaving server did not start")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------ server
    def _serve(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        handlers: set[asyncio.Task[None]] = set()

        async def handle(reader: asyncio.StreamReader, writer: _Writer) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await self._handle(reader, writer)
            finally:
                handlers.discard(task)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(handlers):  # every connection ends, its socket closed
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: _Writer) -> None:
        try:
            while True:
                method = await _read_request(reader)
                if method is None:
                    return
                self.requests += 1
                if not await self._answer(method, writer):
                    return
        except ConnectionError:
            return
        finally:
            writer.close()
            try:
                await asyncio.shield(writer.wait_closed())
            except (ConnectionError, asyncio.CancelledError):
                writer.transport.abort()

    async def _answer(self, method: str, writer: _Writer) -> bool:
        """Answer one request; False when the connection is done."""
        mode = self.mode
        if mode == "trickle-writes":
            if method == "GET":
                await _send(writer, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                return True
            mode = "trickle"
        answers: dict[str, Callable[[_Writer], Awaitable[bool]]] = {
            "trickle": _trickle_body, "trickle-head": _trickle_head, "stall": _stall,
            "garbage": _garbage, "huge": _huge, "flood": _flood}
        if mode in answers:
            return await answers[mode](writer)
        if mode.startswith("redirect-"):
            code = mode.split("-")[1]
            await _send(writer, f"HTTP/1.1 {code} Moved\r\nLocation: http://127.0.0.1:9/"
                        "elsewhere\r\nContent-Length: 0\r\n\r\n".encode())
            return True
        code = mode.split("-")[1]
        body = b"<html>the server is not well</html>"
        await _send(writer, f"HTTP/1.1 {code} Server Error\r\nContent-Length: {len(body)}"
                    "\r\n\r\n".encode() + body)
        return True


async def _read_request(reader: asyncio.StreamReader) -> str | None:
    """Read one request (headers and a ``Content-Length`` body); its method."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return lines[0].split(" ", 1)[0]


async def _send(writer: _Writer, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


async def _forever() -> None:
    await asyncio.Event().wait()


async def _trickle_body(writer: _Writer) -> bool:
    await _send(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(1000):
        await asyncio.sleep(2)
        await _send(writer, b"x")
    return True


async def _trickle_head(writer: _Writer) -> bool:
    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx":
        await _send(writer, bytes([byte]))
        await asyncio.sleep(2)
    return True


async def _stall(writer: _Writer) -> bool:
    await _forever()
    return False


async def _garbage(writer: _Writer) -> bool:
    await _send(writer, b"\x00\xff\x13 this is not HTTP at all \xfe\r\n\r\n")
    return False


async def _huge(writer: _Writer) -> bool:
    await _send(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n" +
                b"\0" * 4096)
    await _forever()
    return False


async def _flood(writer: _Writer) -> bool:
    await _send(writer, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    chunk = b"\0" * (1 << 16)
    while True:
        await _send(writer, chunk)
