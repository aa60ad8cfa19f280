"""The reference suite's cases: what ``matrix/parity.yaml`` runs, one module per level.

* :mod:`.unit` - all-gather / reduce-scatter along one mesh axis, the pair transpose,
  ring attention;
* :mod:`.layer` - the 2-D sharded LayerNorm, the ring-attention layer (zero-init output
  projection, perturbed by the toolkit);
* :mod:`.module` - the pair block (triangle updates + pair-biased row attention) on
  DataModule features;
* :mod:`.workflow` - two SGD steps of the small model: loss, grads, weight deltas;
* :mod:`.property` - RNG entropy of diffusion noise under CP (no serial oracle);
* :mod:`.common` - the suite's distributor behind the toolkit's DataModule, mutant plumbing.

Every case is ``def case(cell) -> None``, uses only :mod:`cpmatrix.parity` and
:mod:`cpmatrix.suite`, and declares the planted bugs it must kill with ``@mutants``
(``@suite_mutants`` for the suite's own). Cases whose op also runs on a 1x1 mesh come in
two functions (``x`` and ``x_single``): ``cpmatrix run --mutants`` runs every cell once per
declared mutant, and a bug that needs two ranks cannot show on one.

Example::

    cpmatrix run -k "ring_attention and 2x3"           # a few cells
    cpmatrix run --mutants -k "1x2 and fp64"           # and every planted bug, killed
"""
