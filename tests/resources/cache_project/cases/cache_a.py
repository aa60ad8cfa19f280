import torch
from cache_helper import SCALE


def case(cell):
    x = torch.ones(3, dtype=cell.dtype) * SCALE
    cell.record("value", float(x.sum()))
