"""Cases for the parity toolkit's own tests: small CP implementations with planted bugs.

Each case is correct unless ``cell.mutant`` switches on one of its declared bugs; the
tests run them through ``cpmatrix run`` on real gloo worlds and check that the right
toolkit check kills each bug and that the correct code passes (positive controls).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_module

from cpmatrix.parity import (
    RngRecorder,
    SyntheticDataModule,
    TensorSpec,
    Tolerance,
    assert_entropy,
    assert_replicated_identical,
    check_parity,
    compare_named,
    distribute,
    mutant_on,
    mutants,
    tolerance_for,
)
from cpmatrix.parity.data import PAIR_FEATS, TOKEN_FEATS

# ----------------------------------------------------------------------------------------
# CP building blocks


def _groups(mesh: Any, dims: list[int]) -> list[Any]:
    return [mesh.get_group(d) for d in dims if mesh.size(d) > 1]


def _sharded_dims(x: DTensor, tensor_dim: int) -> list[int]:
    return [d for d, p in enumerate(x.placements) if isinstance(p, Shard) and p.dim == tensor_dim]


def _from_local(local: torch.Tensor, like: DTensor, last: int) -> DTensor:
    shape = torch.Size((*like.shape[:-1], last))
    return DTensor.from_local(local, like.device_mesh, like.placements, shape=shape,
                              stride=torch.empty(shape, device="meta").stride())


class _ReduceGrad(torch.autograd.Function):
    """Identity forward; all-reduce of the grad over the sharded mesh axes in backward:
    a replicated parameter's grad is the sum of every shard's contribution."""

    @staticmethod
    def forward(ctx: Any, param: torch.Tensor, groups: list[Any], skip: bool) -> torch.Tensor:
        ctx.groups, ctx.skip = groups, skip
        return param.view_as(param)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        grad = grad.clone()
        if not ctx.skip:  # mutant no_allreduce: each rank keeps its partial sum
            for group in ctx.groups:
                dist.all_reduce(grad, group=group)
        return grad, None, None


class _AllReduceSum(torch.autograd.Function):
    """Sum over a mesh axis whose result is then replicated: backward is the identity
    (each replica gets the same grad; summing it again would multiply by the axis size)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, groups: list[Any]) -> torch.Tensor:
        x = x.clone()
        for group in groups:
            dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad, None


class CPLinear(nn.Linear):
    """nn.Linear on rows sharded over the mesh; plain replicated parameters."""

    def __init__(self, d_in: int, d_out: int, cell: Any) -> None:
        super().__init__(d_in, d_out)
        self.cell = cell

    def forward(self, input: DTensor) -> DTensor:  # type: ignore[override]
        x = input  # nn.Linear's argument name: check_parity calls fn(input=...)
        rows = _sharded_dims(x, 0)
        groups = _groups(x.device_mesh, rows)
        skip = mutant_on(self.cell, "no_allreduce")
        w = _ReduceGrad.apply(self.weight, groups, skip)
        b = _ReduceGrad.apply(self.bias, groups, skip)
        local = x.to_local()
        if mutant_on(self.cell, "fp32_roundtrip"):
            y = F.linear(local.float(), w.float(), b.float()).to(local.dtype)
        else:
            y = F.linear(local, w, b)
        return _from_local(y, x, self.out_features)


class _CenterResidual(torch.autograd.Function):
    """y = x + (x - mean over dim 0), dim 0 sharded; the mean needs an all-reduce."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, n: int, groups: list[Any], bug: bool) -> torch.Tensor:
        total = x.sum(0, keepdim=True)
        for group in groups:
            dist.all_reduce(total, group=group)
        ctx.n, ctx.groups, ctx.bug = n, groups, bug
        return 2 * x - total / n

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        total = g.sum(0, keepdim=True)
        for group in ctx.groups:
            dist.all_reduce(total, group=group)
        centred = g - total / ctx.n
        # mutant bwd_sign: the centring term's sign is flipped. With a uniform grad_output
        # the centred term is zero, so the bug is invisible; a random one shows it.
        return (g - centred if ctx.bug else g + centred), None, None, None


def center_residual_serial(x: torch.Tensor) -> torch.Tensor:
    return x + (x - x.mean(0, keepdim=True))


def center_residual_cp(x: DTensor, cell: Any) -> DTensor:
    groups = _groups(x.device_mesh, _sharded_dims(x, 0))
    y = _CenterResidual.apply(x.to_local(), x.shape[0], groups, mutant_on(cell, "bwd_sign"))
    return _from_local(y, x, x.shape[-1])


def _seq_placements(cell: Any) -> list[Any]:
    return [Shard(0), Shard(0)]  # rows over the flattened (cp0, cp1) mesh


def _seq(cell: Any) -> int:
    return int(cell.params.get("seq", 7))


# ----------------------------------------------------------------------------------------
# layer: CP linear


@mutants(
    no_allreduce="the replicated weight/bias grad misses its all-reduce over the sharded axes",
    fp32_roundtrip="the fp64 path computes the matmul in fp32 and casts back",
)
def linear(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    serial = nn.Linear(16, 8)
    cp = CPLinear(16, 8, cell)
    check_parity(cell, serial, cp, inputs={"input": TensorSpec(shape=(_seq(cell), 16))},
                 placements={"input": _seq_placements(cell)})


def linear_plain(cell: Any) -> None:
    """The same check without mutants, for dtype/autocast cells (where fp32_roundtrip
    is not a bug and would rightly survive)."""
    linear(cell)


# ----------------------------------------------------------------------------------------
# unit: an autograd.Function; uniform vs random grad_output


@mutants(bwd_sign="the backward of the centring flips its sign (hidden by a uniform grad)")
def center(cell: Any) -> None:
    x = torch.randn(_seq(cell), 6, generator=cell.generator, dtype=torch.float64).to(cell.dtype)
    # What a `.sum().backward()` test would see: a uniform grad_output.
    xs = x.clone().requires_grad_()
    center_residual_serial(xs).backward(torch.ones_like(xs))
    xc = distribute(x, cell.mesh, _seq_placements(cell), requires_grad=True)
    yc = center_residual_cp(xc, cell)
    yc.backward(distribute(torch.ones_like(x), cell.mesh, yc.placements))
    tol = tolerance_for(cell.dtype, cell.autocast, cell.path)
    uniform = compare_named({"x": (xc.grad, xs.grad)}, tol)
    cell.record("uniform_grad.passed", all(d.ok for d in uniform))
    cell.record("uniform_grad.max_abs", uniform[0].max_abs)
    # The toolkit: a random grad_output.
    check_parity(cell, center_residual_serial, lambda x: center_residual_cp(x, cell),
                 inputs={"x": TensorSpec.of(x)}, placements={"x": _seq_placements(cell)})


# ----------------------------------------------------------------------------------------
# module: zero-initialised output projection


class ZeroProj(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)
        nn.init.zeros_(self.proj.weight)  # AlphaFold-style "final" init
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(center_residual_serial(x))


class CPZeroProj(nn.Module):
    def __init__(self, d: int, cell: Any) -> None:
        super().__init__()
        self.proj = CPLinear(d, d, cell)
        self.cell = cell

    def forward(self, x: DTensor) -> DTensor:
        return self.proj(center_residual_cp(x, self.cell))


@mutants(bwd_sign="the backward of the centring before the zero-init projection flips sign")
def zero_proj(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    d = 6
    x = torch.randn(_seq(cell), d, generator=cell.generator, dtype=torch.float64).to(cell.dtype)
    g = torch.randn(_seq(cell), d, generator=cell.generator, dtype=torch.float64).to(cell.dtype)
    # What a test without the toolkit sees at zero init: output and input grads are 0 == 0.
    serial, cp = ZeroProj(d).to(cell.dtype), CPZeroProj(d, cell).to(cell.dtype)
    cp.load_state_dict(serial.state_dict())
    xs = x.clone().requires_grad_()
    ys = serial(xs)
    ys.backward(g)
    xc = distribute(x, cell.mesh, _seq_placements(cell), requires_grad=True)
    yc = cp(xc)
    yc.backward(distribute(g, cell.mesh, yc.placements))
    tol = tolerance_for(cell.dtype, cell.autocast, cell.path)
    naive = compare_named({"out": (yc, ys), "x": (xc.grad, xs.grad)}, tol)
    cell.record("unperturbed.passed", all(d.ok for d in naive))
    cell.record("unperturbed.max_abs_out", float(ys.abs().max()))
    cell.record("unperturbed.max_abs_grad", float(xs.grad.abs().max()))
    # The toolkit perturbs the zero-init projection first.
    check_parity(cell, ZeroProj(d), CPZeroProj(d, cell),
                 inputs={"x": TensorSpec.of(x)}, placements={"x": _seq_placements(cell)})


def zero_proj_unperturbed(cell: Any) -> None:
    """Correct code, perturbation switched off: must fail the nonzero check, not pass."""
    torch.manual_seed(cell.seed)
    check_parity(cell, ZeroProj(6), CPZeroProj(6, cell), perturb=False,
                 inputs={"x": TensorSpec(shape=(_seq(cell), 6))},
                 placements={"x": _seq_placements(cell)})


# ----------------------------------------------------------------------------------------
# module: features from the synthetic DataModule (padding, atom layout, 2-D pair sharding)

H = 8


class TokenPool(nn.Module):
    """Token features + mean of each token's atoms + masked mean over pair columns."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Linear(TOKEN_FEATS, H)
        self.atom = nn.Linear(3, H)
        self.pair = nn.Linear(PAIR_FEATS, H)

    def forward(self, feats: dict[str, torch.Tensor], s: torch.Tensor) -> torch.Tensor:
        dtype = s.dtype
        n = feats["token_feats"].shape[0]
        t = self.tok(feats["token_feats"]) + s
        amask = feats["atom_mask"].to(dtype)
        a = self.atom(feats["atom_coords"]) * amask[:, None]
        idx = feats["atom_to_token"]
        pooled = torch.zeros(n, H, dtype=dtype).index_add(0, idx, a)
        count = torch.zeros(n, dtype=dtype).index_add(0, idx, amask).clamp(min=1)
        tmask = feats["token_mask"].to(dtype)
        pair = (self.pair(feats["pair_feats"]) * tmask[None, :, None]).sum(1)
        pair = pair / tmask.sum().clamp(min=1)
        return (t + pooled / count[:, None] + pair) * tmask[:, None]


class CPTokenPool(TokenPool):
    def __init__(self, cell: Any) -> None:
        super().__init__()
        self.cell = cell

    def forward(self, feats: dict[str, DTensor], s: DTensor) -> DTensor:  # type: ignore[override]
        mesh = s.device_mesh
        r, c = mesh.get_coordinate()
        rows_g, both_g = _groups(mesh, [0]), _groups(mesh, [0, 1])
        dtype = s.dtype
        tok_w = _ReduceGrad.apply(self.tok.weight, rows_g, False)
        tok_b = _ReduceGrad.apply(self.tok.bias, rows_g, False)
        atom_w = _ReduceGrad.apply(self.atom.weight, rows_g, False)
        atom_b = _ReduceGrad.apply(self.atom.bias, rows_g, False)
        pair_w = _ReduceGrad.apply(self.pair.weight, both_g, False)
        pair_b = _ReduceGrad.apply(self.pair.bias, both_g, False)
        s_l = s.to_local()
        n_local = s_l.shape[0]
        t = F.linear(feats["token_feats"].to_local(), tok_w, tok_b) + s_l
        amask = feats["atom_mask"].to_local().to(dtype)
        a = F.linear(feats["atom_coords"].to_local(), atom_w, atom_b) * amask[:, None]
        idx = feats["atom_to_token"].to_local() - r * n_local  # global -> local token row
        pooled = torch.zeros(n_local, H, dtype=dtype).index_add(0, idx, a)
        weights = torch.ones_like(amask) if mutant_on(self.cell, "pad_counted") else amask
        count = torch.zeros(n_local, dtype=dtype).index_add(0, idx, weights).clamp(min=1)
        tmask_full = feats["token_mask"].full_tensor().to(dtype)  # pads are False
        cols = feats["pair_feats"].to_local().shape[1]
        col_mask = tmask_full[c * cols : (c + 1) * cols]
        pair = (F.linear(feats["pair_feats"].to_local(), pair_w, pair_b)
                * col_mask[None, :, None]).sum(1)
        if not mutant_on(self.cell, "no_pair_allreduce"):
            pair = _AllReduceSum.apply(pair, _groups(mesh, [1]))
        pair = pair / tmask_full.sum().clamp(min=1)
        row_mask = feats["token_mask"].to_local().to(dtype)
        out = (t + pooled / count[:, None] + pair) * row_mask[:, None]
        return _from_local(out, s, H)


@mutants(
    no_pair_allreduce="the pair reduction over the cp1-sharded columns misses its all-reduce",
    pad_counted="the atom mean counts masked and padded atoms",
)
def token_pool(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    dm = SyntheticDataModule.for_cell(
        cell, n_tokens=_seq(cell),
        feature_subset=("token_feats", "token_mask", "atom_coords", "atom_mask",
                        "atom_to_token", "pair_feats"),
    )
    batch = dm.batch(cell.mesh)
    cell.record("data.padded_tokens", batch.layout.axes["N"].padded)
    cell.record("data.padded_atoms", batch.layout.axes["A"].padded)
    check_parity(cell, TokenPool(), CPTokenPool(cell),
                 inputs={"feats": batch, "s": TensorSpec(shape=("N", H))},
                 placements={"s": ("S0", "R")}, output_axes=("N", None))


# ----------------------------------------------------------------------------------------
# layer: DTensor parameters (distribute_module), no hand-written collectives


def dtensor_mlp(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    serial = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
    check_parity(cell, serial, copy.deepcopy(serial),
                 inputs={"input": TensorSpec(shape=(_seq(cell), 16))},
                 placements={"input": _seq_placements(cell)},
                 prepare_cp=lambda m, mesh: distribute_module(m, mesh))


# ----------------------------------------------------------------------------------------
# workflow: training steps


class _Call(nn.Module):
    """Adapts nn.Sequential to keyword inputs (check_parity calls fn(**inputs))."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Any) -> Any:
        return self.net(x)


@mutants(no_allreduce="the replicated weight grads miss their all-reduce: replicas drift")
def train(cell: Any) -> None:
    torch.manual_seed(cell.seed)
    serial = _Call(nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)))
    cp = _Call(nn.Sequential(CPLinear(16, 16, cell), nn.Tanh(), CPLinear(16, 4, cell)))
    check_parity(cell, serial, cp, inputs={"x": TensorSpec(shape=(_seq(cell), 16))},
                 placements={"x": _seq_placements(cell)},
                 optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), steps=3)


# ----------------------------------------------------------------------------------------
# property: RNG entropy


def token_noise(cell: Any, rows: int = 32, width: int = 8) -> torch.Tensor:
    """CP noise for rows sharded over the flattened mesh: one stream per shard."""
    if mutant_on(cell, "tiled_seed"):
        # the classic bug: every rank draws from the identically seeded global RNG
        return torch.randn(rows, width, dtype=torch.float64)
    r, c = cell.mesh.get_coordinate()
    g = torch.Generator().manual_seed(cell.seed * 7919 + r * cell.mesh.size(1) + c)
    return torch.randn(rows, width, generator=g, dtype=torch.float64)


def pair_noise(cell: Any, rows: int = 32, width: int = 8) -> torch.Tensor:
    """CP noise for rows sharded over cp0 and replicated over cp1: one stream per cp0 shard."""
    if mutant_on(cell, "tiled_seed"):
        return torch.randn(rows, width, dtype=torch.float64)
    r, _ = cell.mesh.get_coordinate()
    shard = cell.rank if mutant_on(cell, "unsynced_replica") else r
    g = torch.Generator().manual_seed(cell.seed * 104729 + 1 + shard)
    return torch.randn(rows, width, generator=g, dtype=torch.float64)


@mutants(
    tiled_seed="every rank draws its shard's noise from the same seed (tiled noise)",
    unsynced_replica="replicas along cp1 seed their replicated pair noise by rank",
)
def rng_noise(cell: Any) -> None:
    with RngRecorder(cell) as rec:
        with rec.scope("token_noise"):
            token_noise(cell)
        with rec.scope("pair_noise"):
            pair_noise(cell)
    rec.save()  # the parent re-checks these files after the join
    fps = rec.gather()
    token = assert_entropy(fps, sharded=("cp0", "cp1"), replicated=(), labels=("token_noise",),
                           min_numel=64)
    pair = assert_entropy(fps, sharded=("cp0",), replicated=("cp1",), labels=("pair_noise",),
                          min_numel=64)
    cell.record("rng.token_noise", "; ".join(token.lines))
    cell.record("rng.pair_noise", "; ".join(pair.lines))


# ----------------------------------------------------------------------------------------
# replicated values


@mutants(third_unsynced="the last of three replicated tensors keeps one element unbroadcast")
def broadcast_trio(cell: Any) -> None:
    """Three values of different sizes and dtypes, broadcast over every mesh axis from the
    group's first rank. The planted bug keeps the third tensor's LAST element as each rank
    computed it: comparing the wrong bytes for a third tensor would miss exactly that."""
    mesh, rank = cell.mesh, dist.get_rank()
    values = {
        "scale": torch.full((3,), float(rank)),  # 12 bytes
        "counts": torch.arange(5, dtype=torch.int64) + rank,  # 40 bytes
        "state": torch.linspace(0, 1, 16, dtype=torch.float64) + rank,  # 128 bytes
    }
    for name, value in values.items():
        own_last = value[-1].clone()
        for group in _groups(mesh, list(range(mesh.ndim))):
            dist.broadcast(value, src=dist.get_process_group_ranks(group)[0], group=group)
        if name == "state" and mutant_on(cell, "third_unsynced"):
            value[-1] = own_last
    out = assert_replicated_identical(values, mesh)
    cell.record("replicated.trio", "; ".join(out.lines) or out.skipped)


# ----------------------------------------------------------------------------------------
# tolerance


def tolerance_refused(cell: Any) -> None:
    """A loosened tolerance without a reason: must fail the tolerance check."""
    check_parity(cell, center_residual_serial, lambda x: center_residual_cp(x, cell),
                 inputs={"x": TensorSpec(shape=(_seq(cell), 4))},
                 placements={"x": _seq_placements(cell)},
                 tolerance=Tolerance(rtol=1e-3, atol=1e-3))


def tolerance_loosened(cell: Any) -> None:
    """A loosened tolerance with a reason: allowed, and the reason is evidence."""
    tol = tolerance_for(cell.dtype, cell.autocast, cell.path).loosen(
        atol=1e-6, reason="demo: the reason must reach the report as evidence")
    check_parity(cell, center_residual_serial, lambda x: center_residual_cp(x, cell),
                 inputs={"x": TensorSpec(shape=(_seq(cell), 4))},
                 placements={"x": _seq_placements(cell)}, tolerance=tol)
