"""cpmatrix: hermetic, batched multi-rank parity tests for context-parallel PyTorch code."""

__version__ = "0.1.0"
