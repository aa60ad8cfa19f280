"""Put first on ``PYTHONPATH`` of a cell's children: a Python child observes its own
reads for the cell (:func:`cpmatrix.worker.observe.child_main`), then the interpreter's
own ``sitecustomize`` (the next one on ``sys.path``), if any, runs as it would have."""

import importlib.machinery
import importlib.util
import os
import sys


def _follow() -> None:
    try:
        from cpmatrix.worker.observe import child_main
    except Exception:  # no cpmatrix here (or another Python): the start stays unanswered
        return
    child_main()


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_follow()
_chain()
