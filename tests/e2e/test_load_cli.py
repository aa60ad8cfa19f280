"""A bad matrix in a real process: exit 2, one line naming the file and line, no
traceback. The loader's own tests are ``tests/unit/test_load.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import run_cli
from matrix_files import HEAD, write_matrix


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        (HEAD + "targets:\n  - {name: a, case: tiny.ok, level: unit}\n", 6, "bad case 'tiny.ok'"),
        (HEAD + "targets: [\n", 6, "YAML syntax error"),
    ],
    ids=["spec", "syntax"],
)
def test_bad_input_in_a_real_process_has_no_traceback(
    text: str, line: int, fragment: str, tmp_path: Path
) -> None:
    path = write_matrix(tmp_path, text)
    proc = run_cli("list", "--matrix", str(path), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {path}:{line}:")
    assert fragment in proc.stderr
