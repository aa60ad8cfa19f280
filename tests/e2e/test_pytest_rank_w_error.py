"""A rank's pytest session under ``-W error``: cpmatrix imported before the session must
not make pytest warn (issue 29, cause 6: every multi-rank test errored under -W error)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_rank_importing_cpmatrix_before_its_session_passes_w_error(tmp_path: Path) -> None:
    # A rank has cpmatrix imported when its session marks the plugin for assertion
    # rewriting (an installed wheel's entry point does; `-p cpmatrix` does the same here):
    # pytest's "Module already imported" warning would be an error under -W error.
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    code = ("import sys, cpmatrix, pytest\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-W', 'error', "
            "'-p', 'cpmatrix', 'test_ok.py']))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
