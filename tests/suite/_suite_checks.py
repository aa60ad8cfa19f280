"""Parity checks of the reference suite, run as cases by ``_suite_cases``.

Every check compares the CP op with its serial twin on the same inputs and weights:
forward output, the gradient of every input and of every parameter, with an explicit
random grad_output and ``assert_close`` default tolerances (fp64 unless the job says
otherwise). Each also asserts what keeps it from being vacuous: sharding is active
when the mesh has more than one rank, gradients are non-zero, replicated parameter
gradients are identical on every rank, and zero-initialized projections are perturbed.

``params["path"] == "kernel"`` runs the CP side on the Triton kernels; the serial side
stays on the reference path, so the kernel is checked against plain torch at the same time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from _suite_cases import Ctx
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from cpmatrix.suite.distribute import (
    from_local,
    local_slices,
    pad_and_shard,
    pair_pad,
    pair_placements,
    pair_size,
    seq_placements,
    undistribute,
)
from cpmatrix.suite.model import (
    CPSmallModel,
    ModelConfig,
    SmallModel,
    distribute_batch,
    make_batch,
    train_step,
)
from cpmatrix.suite.ops.attention_layer import Attention, CPAttention
from cpmatrix.suite.ops.collectives import (
    Ring,
    all_gather,
    all_reduce_sum,
    reduce_scatter,
    replicate_grad,
    transpose_pair,
)
from cpmatrix.suite.ops.layernorm import LayerNorm, ShardedLayerNorm
from cpmatrix.suite.ops.pair_attention import CPPairAttention, PairAttention
from cpmatrix.suite.ops.pair_block import CPPairBlock, PairBlock
from cpmatrix.suite.ops.ring_attention import (
    attention_serial,
    ring_attention,
    ring_attention_local,
)
from cpmatrix.suite.ops.triangle import CPTriangleMultiplication, TriangleMultiplication

PAIR_MASK_PL = pair_placements(2, channels_last=False)


# ----------------------------------------------------------------------------- helpers

def _n(ctx: Ctx) -> int:
    return int(ctx.params.get("n", 5))


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_()


def _sharding_active(ctx: Ctx, what: str, dt: DTensor) -> None:
    if ctx.world > 1:
        ctx.rec.true(f"{what} sharding active", dt.to_local().numel() < dt.numel(),
                     f"local {tuple(dt.to_local().shape)} vs global {tuple(dt.shape)}")


def _nonzero(ctx: Ctx, what: str, t: torch.Tensor | None) -> None:
    ok = t is not None and bool(torch.isfinite(t).all()) and bool(t.abs().sum() > 0)
    ctx.rec.true(f"{what} non-zero and finite", ok)


def _identical_across_ranks(ctx: Ctx, what: str, t: torch.Tensor) -> None:
    """A replicated value must be bitwise identical on every rank."""
    flat = t.detach().reshape(-1).contiguous()
    bufs = [torch.empty_like(flat) for _ in range(ctx.world)]
    dist.all_gather(bufs, flat, group=ctx.group)
    ctx.rec.true(f"{what} identical on all ranks", all(torch.equal(b, flat) for b in bufs))


def _perturb(module: nn.Module, gen: torch.Generator) -> None:
    """Move every parameter off its init (zero-init projections would make parity vacuous)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def _module_parity(ctx: Ctx, what: str, serial: nn.Module, cp: nn.Module, x: torch.Tensor,
                   mask: torch.Tensor | None, x_pl: Any, m_pl: Any,
                   pad: dict[int, int] | None) -> None:
    """CP module vs serial twin: output, input grad and every parameter grad.

    ``ctx.params["autocast"]`` runs both forwards under bf16 autocast (parameters stay
    in ``ctx.dtype``); ``ctx.dtype == bfloat16`` runs everything in bf16. The two sides
    then round at different points (a rank's partial sum is rounded to bf16 before the
    all-reduce; the serial sum once), so they agree only to bf16's error budget. The
    budget is measured, not guessed: an fp64 twin of the serial module (same weights,
    inputs and grad_output) gives the exact value, and the CP side may be off it by at
    most twice what the serial side itself is off it, plus bf16's rtol (1.6e-2, about two
    ulps) of the tensor's scale. A fixed tolerance relative to the result's scale fails
    wherever a sum cancels (a parameter grad summed over N*N pair entries whose partial
    sums are much larger than the total); a real bug (a missing reduction, a wrong shard)
    is off by the scale of the result, far outside either budget.
    """
    autocast = bool(ctx.params.get("autocast", False))
    low_precision = autocast or ctx.dtype == torch.bfloat16
    serial.to(ctx.dtype)
    _perturb(serial, ctx.gen)
    cp.to(ctx.dtype)
    cp.load_state_dict(serial.state_dict())
    g = ctx.randn(*x.shape)

    def run(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        if not autocast:
            return fn()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn()

    exact: dict[str, torch.Tensor] = {}
    if low_precision:  # the fp64 twin: what both low-precision sides approximate
        twin = copy.deepcopy(serial).double()
        x64 = _leaf(x.double())
        y64 = twin(x64) if mask is None else twin(x64, mask)
        y64.backward(g.double())
        exact = {"out": y64.detach(), "d_input": x64.grad,
                 **{f"d_{n}": p.grad for n, p in twin.named_parameters()}}

    def close(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
        if not low_precision:
            ctx.rec.close(name, a, b)
            return
        eps = 1.6e-2  # torch.testing's bf16 rtol, about two bf16 ulps
        ref = exact[name.removeprefix(f"{what} ")]
        serial_err = float((b.double() - ref).abs().max())
        scale = float(ref.abs().max())
        ctx.rec.close(name, a.double(), ref, rtol=eps, atol=2 * serial_err + eps * scale)

    xs = _leaf(x)
    ys = run(lambda: serial(xs) if mask is None else serial(xs, mask))
    ys.backward(g.to(ys.dtype))
    xd = _leaf(pad_and_shard(x, ctx.mesh, x_pl, pad_to=pad))
    _sharding_active(ctx, what, xd)
    md = None if mask is None else pad_and_shard(mask, ctx.mesh, m_pl, pad_to=pad)
    yd = run(lambda: cp(xd) if md is None else cp(xd, md))
    ctx.rec.true(f"{what} out dtype", yd.dtype == ys.dtype, f"{yd.dtype} vs {ys.dtype}")
    yd.backward(pad_and_shard(g.to(yd.dtype), ctx.mesh, x_pl, pad_to=pad))
    close(f"{what} out", undistribute(yd, x.shape), ys)
    close(f"{what} d_input", undistribute(xd.grad, x.shape), xs.grad)
    _nonzero(ctx, f"{what} d_input", xs.grad)
    cp_params = dict(cp.named_parameters())
    for name, ps in serial.named_parameters():
        close(f"{what} d_{name}", cp_params[name].grad, ps.grad)
        _nonzero(ctx, f"{what} d_{name}", ps.grad)
    _identical_across_ranks(ctx, f"{what} param grads",
                            torch.cat([p.grad.reshape(-1) for p in cp.parameters()]))


# ----------------------------------------------------------------------------- unit

def check_distribute(ctx: Ctx) -> None:
    n, (nr, nc) = _n(ctx), ctx.shape
    x = ctx.randn(n, n + 1, 3)
    xd = pad_and_shard(x, ctx.mesh, (Shard(0), Shard(1)))
    full = xd.full_tensor()
    rows, cols = -(-n // nr) * nr, -(-(n + 1) // nc) * nc
    ctx.rec.true("padded global shape", tuple(full.shape) == (rows, cols, 3), str(full.shape))
    ctx.rec.close("round trip", undistribute(xd, x.shape), x)
    ctx.rec.true("padding is zero", float(full[n:].abs().sum() + full[:, n + 1:].abs().sum()) == 0)
    _sharding_active(ctx, "pair", xd)
    s = ctx.randn(n, 2)
    sd = pad_and_shard(s, ctx.mesh, seq_placements(0))
    ctx.rec.close("seq round trip", undistribute(sd, s.shape), s)
    sl = local_slices(sd.shape, ctx.mesh, seq_placements(0))[0]
    ctx.rec.true("seq shard is block r*C+c",
                 sl.start == (ctx.mesh.get_local_rank("cp0") * nc + ctx.mesh.get_local_rank("cp1"))
                 * sd.to_local().shape[0])
    z = ctx.randn(n, n, 2)
    zd = pad_and_shard(z, ctx.mesh, pair_placements(3), pad_to=pair_pad(z, ctx.mesh))
    ctx.rec.true("pair stays square", zd.shape[0] == zd.shape[1] == pair_size(n, ctx.mesh))


def check_all_gather(ctx: Ctx) -> None:
    nr, nc = ctx.shape
    r, c = ctx.mesh.get_local_rank("cp0"), ctx.mesh.get_local_rank("cp1")
    npad = pair_size(_n(ctx), ctx.mesh)
    x = ctx.randn(npad, npad, 3)
    sl = local_slices(x.shape, ctx.mesh, pair_placements(3))
    for axis, dim in (("cp1", 1), ("cp0", 0)):
        xl = _leaf(x[sl])
        y = all_gather(xl, ctx.mesh, axis, dim)
        expect = x[sl[0], :] if axis == "cp1" else x[:, sl[1]]
        ctx.rec.close(f"all_gather {axis} out", y, expect)
        g_all = ctx.randn(nr, nc, *y.shape)
        y.backward(g_all[r, c])
        # every rank of the axis used our block: its gradient is the sum of theirs
        if axis == "cp1":
            want = sum(g_all[r, c2][:, sl[1]] for c2 in range(nc))
        else:
            want = sum(g_all[r2, c][sl[0], :] for r2 in range(nr))
        ctx.rec.close(f"all_gather {axis} d_input", xl.grad, want)
        _nonzero(ctx, f"all_gather {axis} d_input", xl.grad)


def check_reduce_scatter(ctx: Ctx) -> None:
    nr, nc = ctx.shape
    r, c = ctx.mesh.get_local_rank("cp0"), ctx.mesh.get_local_rank("cp1")
    m = 2 * nr * nc
    p_all = ctx.randn(nr, nc, m, 3)
    for axis, size, idx in (("cp1", nc, c), ("cp0", nr, r)):
        xl = _leaf(p_all[r, c])
        y = reduce_scatter(xl, ctx.mesh, axis, 0)
        blk = slice(idx * (m // size), (idx + 1) * (m // size))
        group = ([p_all[r, k] for k in range(nc)] if axis == "cp1"
                 else [p_all[k, c] for k in range(nr)])
        ctx.rec.close(f"reduce_scatter {axis} out", y, sum(group)[blk])
        g_all = ctx.randn(nr, nc, *y.shape)
        y.backward(g_all[r, c])
        parts = ([g_all[r, k] for k in range(nc)] if axis == "cp1"
                 else [g_all[k, c] for k in range(nr)])
        ctx.rec.close(f"reduce_scatter {axis} d_input", xl.grad, torch.cat(parts, 0))


def check_replicate_grad(ctx: Ctx) -> None:
    nr, nc = ctx.shape
    r, c = ctx.mesh.get_local_rank("cp0"), ctx.mesh.get_local_rank("cp1")
    x_all, g_all = ctx.randn(nr, nc, 4, 3), ctx.randn(nr, nc, 4, 3)
    for axes in (("cp0", "cp1"), ("cp1",)):
        p = _leaf(ctx.randn(3))
        (replicate_grad(p, ctx.mesh, axes) * x_all[r, c]).backward(g_all[r, c])
        contrib = (x_all * g_all).sum(2)  # (R, C, 3): each rank's partial gradient
        want = contrib.sum((0, 1)) if len(axes) == 2 else contrib[r].sum(0)
        ctx.rec.close(f"replicate_grad {axes}", p.grad, want)
        _identical_across_ranks(ctx, f"replicate_grad {axes} grad",
                                p.grad if len(axes) == 2 else contrib.sum((0, 1)))
    xl = _leaf(x_all[r, c])
    y = all_reduce_sum(xl, ctx.mesh, ("cp0", "cp1"))
    ctx.rec.close("all_reduce_sum out", y, x_all.sum((0, 1)))
    g = ctx.randn(*y.shape)
    y.backward(g)
    ctx.rec.close("all_reduce_sum d_input (pass-through)", xl.grad, g)


def check_transpose(ctx: Ctx) -> None:
    n = _n(ctx)
    z = ctx.randn(n, n, 3)
    pad = pair_pad(z, ctx.mesh)
    pl = pair_placements(3)
    zl = _leaf(pad_and_shard(z, ctx.mesh, pl, pad_to=pad).to_local())
    w = transpose_pair(zl, ctx.mesh)
    npad = pad[0]
    wd = from_local(w, ctx.mesh, pl, (npad, npad, 3))
    ctx.rec.close("transpose out", undistribute(wd, z.shape), z.transpose(0, 1))
    g = ctx.randn(n, n, 3)
    w.backward(pad_and_shard(g, ctx.mesh, pl, pad_to=pad).to_local())
    gd = from_local(zl.grad, ctx.mesh, pl, (npad, npad, 3))
    ctx.rec.close("transpose d_input", undistribute(gd, z.shape), g.transpose(0, 1))
    # a batched pair tensor (B, N, N, c) and a mask-like (N, N) one
    zb = ctx.randn(2, n, n, 2)
    zbd = pad_and_shard(zb, ctx.mesh, pair_placements(4), pad_to=pair_pad(zb, ctx.mesh))
    wb = from_local(transpose_pair(zbd.to_local(), ctx.mesh), ctx.mesh, zbd.placements, zbd.shape)
    ctx.rec.close("transpose batched", undistribute(wb, zb.shape), zb.transpose(1, 2))
    m = ctx.randn(n, n)
    md = pad_and_shard(m, ctx.mesh, PAIR_MASK_PL, pad_to=pair_pad(m, ctx.mesh, channels_last=False))
    wm = transpose_pair(md.to_local(), ctx.mesh, row_dim=0, col_dim=1)
    ctx.rec.close("transpose 2-d", undistribute(from_local(wm, ctx.mesh, PAIR_MASK_PL, md.shape),
                                                m.shape), m.t())


def _attn_inputs(ctx: Ctx, s: int) -> tuple[torch.Tensor, ...]:
    b, h, d = 2, 2, 4
    q, k, v = ctx.randn(b, h, s, d), ctx.randn(b, h, s, d), ctx.randn(b, h, s, d + 1)
    mask = ctx.mask(b, 1, s)
    mask[0, 0, 0] = True
    mask[1] = False  # a batch element whose keys are all masked: zeros, -inf lse
    return q, k, v, mask, ctx.randn(b, h, s, d + 1)


def check_ring_attention(ctx: Ctx) -> None:
    n = _n(ctx) + 2
    q, k, v, mask, g = _attn_inputs(ctx, n)
    qs, ks, vs = _leaf(q), _leaf(k), _leaf(v)
    ys = attention_serial(qs, ks, vs, key_mask=mask)
    ys.backward(g)
    ctx.rec.true("fully masked batch element is zero", bool((ys[1] == 0).all()))
    layouts: dict[str, Any] = {"flattened": seq_placements(2), "cp1 ring": (Replicate(), Shard(2))}
    for name, pl in layouts.items():
        qd, kd, vd = (_leaf(pad_and_shard(t, ctx.mesh, pl)) for t in (q, k, v))
        if name == "flattened":
            _sharding_active(ctx, "ring q", qd)
        out = ring_attention(qd, kd, vd, key_mask=pad_and_shard(mask, ctx.mesh, pl))
        out.backward(pad_and_shard(g, ctx.mesh, pl))
        ctx.rec.close(f"ring[{name}] out", undistribute(out, ys.shape), ys)
        for t, ts, nm in ((qd, qs, "dq"), (kd, ks, "dk"), (vd, vs, "dv")):
            ctx.rec.close(f"ring[{name}] {nm}", undistribute(t.grad, ts.shape), ts.grad)
    for nm, t in (("dq", qs), ("dk", ks), ("dv", vs)):
        _nonzero(ctx, f"ring {nm}", t.grad)


def check_ring_attention_bias(ctx: Ctx) -> None:
    n = _n(ctx) + 1
    q, k, v, mask, g = _attn_inputs(ctx, n)
    bias = ctx.randn(1, 2, n, n)  # broadcast over the batch, like the pair bias
    qs, ks, vs, bs = _leaf(q), _leaf(k), _leaf(v), _leaf(bias)
    ys = attention_serial(qs, ks, vs, key_mask=mask, bias=bs)
    ys.backward(g)
    pl = seq_placements(2)
    ring = Ring.along(ctx.mesh, ("cp0", "cp1"))
    qd, kd, vd = (pad_and_shard(t, ctx.mesh, pl) for t in (q, k, v))
    spad = qd.shape[2]
    bd = pad_and_shard(bias, ctx.mesh, pl, pad_to={3: spad})  # query rows sharded, all keys
    ql, kl, vl, bl = (_leaf(t.to_local()) for t in (qd, kd, vd, bd))
    key_mask = pad_and_shard(mask, ctx.mesh, pl).to_local()
    out = ring_attention_local(ql, kl, vl, ring, key_mask=key_mask, bias=bl)
    out.backward(pad_and_shard(g, ctx.mesh, pl).to_local())
    ctx.rec.close("ring+bias out", undistribute(from_local(out, ctx.mesh, pl, (*qd.shape[:3], 5)),
                                                ys.shape), ys)
    for lt, dt, ts, nm in ((ql, qd, qs, "dq"), (kl, kd, ks, "dk"), (vl, vd, vs, "dv"),
                           (bl, bd, bs, "dbias")):
        full = undistribute(from_local(lt.grad, ctx.mesh, pl, dt.shape), ts.shape)
        ctx.rec.close(f"ring+bias {nm}", full, ts.grad)
    _nonzero(ctx, "ring+bias dbias", bs.grad)


# ----------------------------------------------------------------------------- layer

def check_layer_norm(ctx: Ctx) -> None:
    n, c = _n(ctx), 6
    path = ctx.params.get("path", "reference")
    z = ctx.randn(n, n, c) * 2 + 1
    _module_parity(ctx, "pair LN", LayerNorm(c), ShardedLayerNorm(c, ctx.mesh, path=path),
                   z, None, pair_placements(3), None, pair_pad(z, ctx.mesh))
    s = ctx.randn(n + 2, c)
    _module_parity(ctx, "seq LN", LayerNorm(c), ShardedLayerNorm(c, ctx.mesh, path=path),
                   s, None, seq_placements(0), None, None)


def check_attention_layer(ctx: Ctx) -> None:
    n, dim = _n(ctx) + 2, 8
    path = ctx.params.get("path", "reference")
    x, mask = ctx.randn(2, n, dim), ctx.mask(2, n)
    mask[:, 0] = True
    _module_parity(ctx, "attention", Attention(dim, 2, 4),
                   CPAttention(dim, 2, 4, ctx.mesh, path=path), x, mask, seq_placements(1),
                   seq_placements(1), None)


# ----------------------------------------------------------------------------- module

def _pair(ctx: Ctx, c: int) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
    n = _n(ctx)
    z, mask = ctx.randn(n, n, c), ctx.mask(n, n, frac=0.15)
    return z, mask, pair_pad(z, ctx.mesh)


def _pair_check(ctx: Ctx, what: str, serial: nn.Module, cp: nn.Module, c: int) -> None:
    z, mask, pad = _pair(ctx, c)
    _module_parity(ctx, what, serial, cp, z, mask, pair_placements(3), PAIR_MASK_PL, pad)


def check_triangle_outgoing(ctx: Ctx) -> None:
    path = ctx.params.get("path", "reference")
    _pair_check(ctx, "tri_out", TriangleMultiplication(6, 4, "outgoing"),
                CPTriangleMultiplication(6, 4, "outgoing", ctx.mesh, path=path), 6)


def check_triangle_incoming(ctx: Ctx) -> None:
    path = ctx.params.get("path", "reference")
    _pair_check(ctx, "tri_in", TriangleMultiplication(6, 4, "incoming"),
                CPTriangleMultiplication(6, 4, "incoming", ctx.mesh, path=path), 6)


def check_pair_attention(ctx: Ctx) -> None:
    path = ctx.params.get("path", "reference")
    _pair_check(ctx, "pair_attn", PairAttention(6, 2, 3),
                CPPairAttention(6, 2, 3, ctx.mesh, path=path), 6)


def check_pair_block(ctx: Ctx) -> None:
    path = ctx.params.get("path", "reference")
    _pair_check(ctx, "pair_block", PairBlock(6, 4, 2, 3),
                CPPairBlock(6, 4, 2, 3, ctx.mesh, path=path), 6)


# ----------------------------------------------------------------------------- workflow

def check_train_step(ctx: Ctx) -> None:
    cfg = ModelConfig()
    serial = SmallModel(cfg).to(ctx.dtype)
    _perturb(serial, ctx.gen)
    cp = CPSmallModel(cfg, ctx.mesh).to(ctx.dtype)
    cp.load_state_dict(serial.state_dict())
    batch = make_batch(_n(ctx) + 2, cfg, generator=ctx.gen, dtype=ctx.dtype)
    dbatch = distribute_batch(batch, ctx.mesh)
    _sharding_active(ctx, "model pair input", dbatch.pair)  # type: ignore[arg-type]
    before = {k: v.detach().clone() for k, v in serial.state_dict().items()}
    opt_s = torch.optim.SGD(serial.parameters(), lr=0.05, momentum=0.9)
    opt_c = torch.optim.SGD(cp.parameters(), lr=0.05, momentum=0.9)
    for step in range(2):
        ls, lc = train_step(serial, batch, opt_s), train_step(cp, dbatch, opt_c)
        ctx.rec.close(f"loss step {step}", torch.tensor(lc), torch.tensor(ls))
    cp_state = cp.state_dict()
    for name, p0 in before.items():
        ds, dc = serial.state_dict()[name] - p0, cp_state[name] - p0
        ctx.rec.close(f"weight delta {name}", dc, ds)
        _nonzero(ctx, f"weight delta {name}", ds)
    _identical_across_ranks(ctx, "cp weights",
                            torch.cat([v.reshape(-1) for v in cp_state.values()]))


CHECKS: dict[str, Callable[[Ctx], None]] = {
    name[len("check_"):]: fn for name, fn in list(globals().items())
    if name.startswith("check_") and callable(fn)
}
