"""Reads the mutants each case declares, in a child process (torch stays out of cpmatrix).

    python -m cpmatrix.worker.discover_main PYTHONPATH_JSON CASES_JSON

Prints one JSON object: case ref -> its mutant names (``fn.__cpmatrix_mutants__``), or
``{"error": "..."}`` for a case that cannot be imported. Standard library only.
"""

from __future__ import annotations

import importlib
import json
import sys

from cpmatrix.module_names import DISCOVER_MAIN


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: python -m {DISCOVER_MAIN} PYTHONPATH_JSON CASES_JSON",
              file=sys.stderr)
        return 2
    sys.path[:0] = json.loads(args[0])
    out: dict[str, object] = {}
    for ref in json.loads(args[1]):
        module, _, attr = ref.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
            out[ref] = list(getattr(fn, "__cpmatrix_mutants__", {}) or {})
        except Exception as exc:  # reported per case: never "0/0 killed"
            out[ref] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
