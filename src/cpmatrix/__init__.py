"""cpmatrix: hermetic, batched multi-rank parity tests for context-parallel PyTorch code.

PYTEST_DONT_REWRITE: cpmatrix is a pytest plugin (an installed wheel's is marked for
assertion rewriting) that a world's ranks import before their pytest session starts;
without this marker pytest warns "Module already imported so cannot be rewritten" there,
an error under ``-W error`` or ``filterwarnings = error``. It has no asserts to rewrite.
"""

__version__ = "0.1.0"
