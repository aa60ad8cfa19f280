"""A small but real DTensor parity check (matmul + layer_norm, forward and backward),
the kind of cell the batching benchmark multiplies."""

import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def matmul_layernorm(cell):
    g = cell.generator
    x = torch.randn(12, 16, generator=g, dtype=cell.dtype)
    w = torch.randn(16, 16, generator=g, dtype=cell.dtype)
    grad = torch.randn(12, 16, generator=g, dtype=cell.dtype)
    xs = x.clone().requires_grad_()
    ws = w.clone().requires_grad_()
    ys = torch.nn.functional.layer_norm(xs @ ws, (16,))
    ys.backward(grad)
    mesh = cell.mesh
    xd = distribute_tensor(x, mesh, [Shard(0), Replicate()]).requires_grad_()
    wd = distribute_tensor(w, mesh, [Replicate(), Replicate()]).requires_grad_()
    yd = torch.nn.functional.layer_norm(xd @ wd, (16,))
    yd.backward(distribute_tensor(grad, mesh, [Shard(0), Replicate()]))
    torch.testing.assert_close(yd.full_tensor(), ys)
    torch.testing.assert_close(xd.grad.full_tensor(), xs.grad)
    torch.testing.assert_close(wd.grad.full_tensor(), ws.grad)
    cell.record("max_abs_err", float((yd.full_tensor() - ys).abs().max()))
