"""Comments and docstrings say why the code is as it is, not what it was before.

A source scan (no import): the package's comments and docstrings may not narrate history
("as before", "previously", ...); git holds it, and a reader of the code needs what is
true now. Messages to users are not scanned (a flag's old spelling may be named there,
so that the user learns the new one).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "cpmatrix"

#: Phrases that tell a change rather than a reason. ("no longer" and "now" are left out:
#: "the model no longer computes what it did" and "the cell running now" say what is.)
HISTORY = re.compile(r"\b(as before|previously|formerly|used to be|was renamed|"
                     r"is now named|two executors exist|one torchrun launch)\b", re.IGNORECASE)


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of ``source``."""
    found = [(tok.start[0], tok.string) for tok in
             tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None and node.body:
                found.append((node.body[0].lineno, doc))
    return found


def history_in(source: str) -> list[str]:
    if not HISTORY.search(" ".join(source.split())):  # most modules: nothing to parse
        return []
    return [f"{line}: {m.group(0)!r}" for line, text in prose(source)
            for m in HISTORY.finditer(" ".join(text.split()))]


def test_the_scan_reads_the_package() -> None:
    assert len(list(PACKAGE.rglob("*.py"))) > 100


def test_no_comment_or_docstring_narrates_history() -> None:
    found = [f"{p.relative_to(PACKAGE)}:{hit}" for p in sorted(PACKAGE.rglob("*.py"))
             for hit in history_in(p.read_text())]
    assert not found, "say why, not what happened before (git has it):\n" + "\n".join(found)


def test_the_scan_sees_planted_history() -> None:
    planted = ('"""Two executors\n   exist: world and compile."""\n'
               "X = 1  # as before slots\n"
               'MESSAGE = "is now --durations-from (the old spelling is refused)"\n'
               "def f():\n    '''The cell running now; previously the first one.'''\n")
    assert history_in(planted) == ["3: 'as before'", "1: 'Two executors exist'",
                                   "6: 'previously'"]
