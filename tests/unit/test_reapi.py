"""The ActionResult cpmatrix writes is the one Bazel's caches read: checked against the real
protobuf library, with the messages declared as in remote_execution.proto."""

from __future__ import annotations

import doctest

import pytest

# protobuf is in the dev extra for this test alone: a missing one is a setup error, not a skip.
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from cpmatrix.cache import reapi
from cpmatrix.cache.reapi import ActionResult, Digest, OutputFile


def _classes() -> tuple[type, type, type]:
    """Digest, OutputFile and ActionResult of REAPI v2, built from a descriptor (the fields
    cpmatrix uses plus the others of ActionResult, which a reader must skip)."""
    fd = descriptor_pb2.FileDescriptorProto(name="reapi_test.proto",
                                            package="build.bazel.remote.execution.v2",
                                            syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto

    def message(name: str, fields: list[tuple[str, int, int, int, str]]) -> None:
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg = ".build.bazel.remote.execution.v2."
    message("Digest", [("hash", 1, F.TYPE_STRING, opt, ""),
                       ("size_bytes", 2, F.TYPE_INT64, opt, "")])
    message("OutputFile", [("path", 1, F.TYPE_STRING, opt, ""),
                           ("digest", 2, F.TYPE_MESSAGE, opt, msg + "Digest"),
                           ("is_executable", 4, F.TYPE_BOOL, opt, ""),
                           ("contents", 5, F.TYPE_BYTES, opt, "")])
    message("ActionResult", [("output_files", 2, F.TYPE_MESSAGE, rep, msg + "OutputFile"),
                             ("exit_code", 4, F.TYPE_INT32, opt, ""),
                             ("stdout_raw", 5, F.TYPE_BYTES, opt, ""),
                             ("stdout_digest", 6, F.TYPE_MESSAGE, opt, msg + "Digest")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    names = ("Digest", "OutputFile", "ActionResult")
    return tuple(message_factory.GetMessageClass(  # type: ignore[return-value]
        pool.FindMessageTypeByName(f"build.bazel.remote.execution.v2.{n}")) for n in names)


PbDigest, PbOutputFile, PbActionResult = _classes()

RESULT = ActionResult(outputs=(
    OutputFile("cpmatrix/entry.json", Digest("a" * 64, 1234)),
    OutputFile("cpmatrix/logs/rank0.log", Digest("0123456789abcdef" * 4, 2**40 + 7)),
))


def test_protobuf_reads_what_cpmatrix_writes() -> None:
    pb = PbActionResult()
    pb.ParseFromString(RESULT.encode())
    assert [(f.path, f.digest.hash, f.digest.size_bytes) for f in pb.output_files] == [
        ("cpmatrix/entry.json", "a" * 64, 1234),
        ("cpmatrix/logs/rank0.log", "0123456789abcdef" * 4, 2**40 + 7)]
    assert pb.exit_code == 0


def test_cpmatrix_reads_what_protobuf_writes_and_skips_unknown_fields() -> None:
    pb = PbActionResult(exit_code=-3, stdout_raw=b"hello",
                        stdout_digest=PbDigest(hash="f" * 64, size_bytes=5))
    pb.output_files.add(path="x/y.json", digest=PbDigest(hash="b" * 64, size_bytes=9),
                        is_executable=True, contents=b"inline")
    decoded = ActionResult.decode(pb.SerializeToString())
    assert decoded == ActionResult(outputs=(OutputFile("x/y.json", Digest("b" * 64, 9)),),
                                   exit_code=-3)
    assert decoded.encode() != pb.SerializeToString()  # the unknown fields were skipped


def test_a_non_zero_exit_code_round_trips() -> None:
    pb = PbActionResult()
    pb.ParseFromString(ActionResult(outputs=RESULT.outputs, exit_code=2).encode())
    assert pb.exit_code == 2


@pytest.mark.parametrize("junk", [
    b"\x12\x05ab",                  # a length running past the end
    b"\x12",                        # a key and nothing else
    b"\x80",                        # a truncated varint
    b"\x00\x01",                    # field number 0
    b"\x13\x00",                    # wire type 3 (groups): not supported
    b"\x12\x02\x0a\x00",            # an output file without a digest
    b"\x12\x03\x0a\x01\xff",        # a path that is not UTF-8
])
def test_what_does_not_parse_raises_value_error(junk: bytes) -> None:
    with pytest.raises((ValueError, UnicodeDecodeError)):
        ActionResult.decode(junk)


def test_doctests() -> None:
    assert doctest.testmod(reapi).failed == 0
