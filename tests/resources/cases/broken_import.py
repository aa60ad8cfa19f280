"""A case module that fails to import."""

raise ImportError("planted: this module cannot be imported")


def case(cell):
    return None
