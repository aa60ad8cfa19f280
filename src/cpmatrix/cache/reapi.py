"""The few messages of Bazel's remote-execution API the remote cache speaks, on the wire.

A Bazel HTTP cache keeps action results under ``/ac/<key>`` as ``ActionResult``
protobufs (bazel-remote checks that they parse as one), and blobs under
``/cas/<sha256>``. cpmatrix writes real ``ActionResult`` messages, so any Bazel cache
takes them as they are; the fields used (from ``build/bazel/remote/execution/v2/
remote_execution.proto``)::

    message Digest       { string hash = 1; int64 size_bytes = 2; }
    message OutputFile   { string path = 1; Digest digest = 2; bool is_executable = 4; }
    message ActionResult { repeated OutputFile output_files = 2; int32 exit_code = 4; }

Protocol buffers' wire format is small enough to write by hand (varints and
length-delimited fields), which keeps protobuf out of cpmatrix's dependencies. Unknown
fields are skipped when reading, as protobuf readers do; anything that does not parse
raises :class:`ValueError`.

Example::

    >>> result = ActionResult(outputs=(OutputFile("entry.json", Digest("ab" * 32, 12)),))
    >>> ActionResult.decode(result.encode()) == result
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ActionResult", "Digest", "OutputFile"]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint (negative ints as their 64-bit two's complement).

    >>> _varint(1), _varint(300), len(_varint(-1))
    (b'\\x01', b'\\xac\\x02', 10)
    """
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _len_field(field: int, payload: bytes) -> bytes:
    return _key(field, _LEN) + _varint(len(payload)) + payload


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field, wire type, value)`` for each field of a message; unknown ones included."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire == _VARINT:
            value, pos = _read_varint(data, pos)
            yield field, wire, value
        elif wire == _LEN:
            size, pos = _read_varint(data, pos)
            if pos + size > len(data):
                raise ValueError("length-delimited field runs past the end")
            yield field, wire, data[pos:pos + size]
            pos += size
        elif wire in (_I64, _I32):
            width = 8 if wire == _I64 else 4
            if pos + width > len(data):
                raise ValueError("fixed-width field runs past the end")
            yield field, wire, data[pos:pos + width]
            pos += width
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ValueError("expected a string field")
    return value.decode("utf-8")


@dataclass(frozen=True, slots=True)
class Digest:
    """A blob's sha256 (lowercase hex) and size: its name in the CAS."""

    hash: str
    size_bytes: int

    def encode(self) -> bytes:
        return _len_field(1, self.hash.encode()) + _key(2, _VARINT) + _varint(self.size_bytes)

    @classmethod
    def decode(cls, data: bytes) -> Digest:
        hash_, size = "", 0
        for field, _wire, value in _fields(data):
            if field == 1:
                hash_ = _text(value)
            elif field == 2 and isinstance(value, int):
                size = value
        return cls(hash_, size)


@dataclass(frozen=True, slots=True)
class OutputFile:
    """One output of an action: a path and the digest of its bytes in the CAS."""

    path: str
    digest: Digest

    def encode(self) -> bytes:
        return _len_field(1, self.path.encode()) + _len_field(2, self.digest.encode())

    @classmethod
    def decode(cls, data: bytes) -> OutputFile:
        path, digest = "", None
        for field, _wire, value in _fields(data):
            if field == 1:
                path = _text(value)
            elif field == 2 and isinstance(value, bytes):
                digest = Digest.decode(value)
        if digest is None:
            raise ValueError(f"output file {path!r} has no digest")
        return cls(path, digest)


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What an action produced: its output files (and exit code, always 0 here: only
    passes are stored)."""

    outputs: tuple[OutputFile, ...]
    exit_code: int = 0

    def encode(self) -> bytes:
        body = b"".join(_len_field(2, f.encode()) for f in self.outputs)
        if self.exit_code:
            body += _key(4, _VARINT) + _varint(self.exit_code)
        return body

    @classmethod
    def decode(cls, data: bytes) -> ActionResult:
        outputs: list[OutputFile] = []
        exit_code = 0
        for field, _wire, value in _fields(data):
            if field == 2 and isinstance(value, bytes):
                outputs.append(OutputFile.decode(value))
            elif field == 4 and isinstance(value, int):
                exit_code = value - (1 << 64) if value >= 1 << 63 else value
        return cls(tuple(outputs), exit_code)

    def output(self, path: str) -> OutputFile | None:
        return next((f for f in self.outputs if f.path == path), None)
