"""Cases of tests/resources/grid.yaml (module a). Only read for digests, never run."""


def ring_attention(cell):
    return None


def allgather(cell):
    return None
