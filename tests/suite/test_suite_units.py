"""Single-process tests of the reference suite: the pure helpers and the serial twins.

The serial twins are the oracle of every parity check, so here they are checked against
independent formulations (explicit loops, ``scaled_dot_product_attention``). Ring
attention's autograd.Function is checked on a ring of one rank, which needs no process
group. Nothing here spawns a world.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from cpmatrix.suite.distribute import padded_size, pair_size, shard_parts, shard_range
from cpmatrix.suite.model import ModelConfig, SmallModel, make_batch
from cpmatrix.suite.mutants import MUTANTS, active, is_planted, planted
from cpmatrix.suite.ops.collectives import Ring
from cpmatrix.suite.ops.pair_attention import PairAttention
from cpmatrix.suite.ops.ring_attention import (
    attention_serial,
    merge_partials,
    ring_attention_local,
)
from cpmatrix.suite.ops.triangle import TriangleMultiplication

F64 = torch.float64


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@dataclass
class FakeMesh:
    """Just enough of a DeviceMesh for the layout helpers: shape, names, coordinate."""

    shape: tuple[int, int]
    coord: tuple[int, int]
    mesh_dim_names: tuple[str, str] = ("cp0", "cp1")

    @property
    def mesh(self) -> torch.Tensor:
        return torch.arange(self.shape[0] * self.shape[1]).reshape(self.shape)

    def size(self, dim: int) -> int:
        return self.shape[dim]

    def get_coordinate(self) -> list[int]:
        return list(self.coord)


# ----------------------------------------------------------------------------- layout

@pytest.mark.parametrize(("n", "m", "want"), [(7, 3, 9), (6, 3, 6), (0, 4, 0), (1, 4, 4)])
def test_padded_size(n: int, m: int, want: int) -> None:
    assert padded_size(n, m) == want


def test_padded_size_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="multiple"):
        padded_size(3, 0)


def test_pair_size_is_a_multiple_of_lcm() -> None:
    assert pair_size(5, FakeMesh((2, 3), (0, 0))) == 6
    assert pair_size(9, FakeMesh((2, 3), (0, 0))) == 12
    assert pair_size(5, FakeMesh((1, 1), (0, 0))) == 5


def test_shard_range_and_its_mutant() -> None:
    assert [shard_range(12, 3, i) for i in range(3)] == [(0, 4), (4, 8), (8, 12)]
    with pytest.raises(ValueError, match="pad to 12"):
        shard_range(10, 3, 0)
    with planted("shard_offset_off_by_one"):
        assert shard_range(12, 3, 1) == (3, 7)
        assert shard_range(12, 3, 0) == (0, 4)


def test_nested_shards_follow_mesh_order() -> None:
    from torch.distributed.tensor import Replicate, Shard

    # (Shard(0), Shard(0)) on 2x3: rank (1, 2) holds block 1*3 + 2 = 5 of 6
    assert shard_parts(FakeMesh((2, 3), (1, 2)), (Shard(0), Shard(0)), 0) == (6, 5)
    assert shard_parts(FakeMesh((2, 3), (1, 2)), (Shard(0), Shard(1)), 1) == (3, 2)
    assert shard_parts(FakeMesh((2, 3), (1, 2)), (Replicate(), Shard(0)), 1) == (1, 0)


@pytest.mark.parametrize(("axes", "coord", "ranks", "index"), [
    (("cp0", "cp1"), (1, 2), (0, 1, 2, 3, 4, 5), 5),
    (("cp1",), (1, 0), (3, 4, 5), 0),
    (("cp0",), (1, 2), (2, 5), 1),
    (("cp1", "cp0"), (0, 1), (0, 3, 1, 4, 2, 5), 2),
])
def test_ring_along(axes: tuple[str, ...], coord: tuple[int, int], ranks: tuple[int, ...],
                    index: int) -> None:
    ring = Ring.along(FakeMesh((2, 3), coord), axes)
    assert (ring.ranks, ring.index) == (ranks, index)
    assert ring.next_rank == ranks[(index + 1) % len(ranks)]
    assert ring.prev_rank == ranks[index - 1]


# ----------------------------------------------------------------------------- mutants

def test_planted_scopes_and_validates() -> None:
    assert active() is None
    with planted("pad_mask_off"):
        assert is_planted("pad_mask_off") and not is_planted("tri_mask_off")
        with planted(None):
            assert active() is None
        assert active() == "pad_mask_off"
    assert active() is None
    with pytest.raises(KeyError, match="unknown mutant"), planted("pad_mask_of"):
        pass
    with pytest.raises(KeyError):
        is_planted("nope")


def test_mutant_registry_is_documented() -> None:
    for name, m in MUTANTS.items():
        assert m.name == name and m.site.startswith("suite.") and m.effect and m.needs


# ----------------------------------------------------------------------------- attention math

def test_merge_of_partials_is_the_joint_softmax() -> None:
    g = _g()
    s, v = torch.randn(3, 11, generator=g, dtype=F64), torch.randn(11, 4, generator=g, dtype=F64)
    parts = [(0, 4), (4, 5), (5, 11)]
    out = lse = None
    for a, b in parts:
        blk = s[:, a:b]
        lb = torch.logsumexp(blk, -1)
        ob = torch.softmax(blk, -1) @ v[a:b]
        out, lse = (ob, lb) if out is None else merge_partials(out, lse, ob, lb)
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1))


def test_merge_handles_empty_partials() -> None:
    o = torch.randn(2, 3, dtype=F64)
    ninf = torch.full((2,), float("-inf"), dtype=F64)
    lse = torch.tensor([0.5, -1.0], dtype=F64)
    out, l2 = merge_partials(torch.zeros_like(o), ninf, o, lse)
    torch.testing.assert_close(out, o)
    torch.testing.assert_close(l2, lse)
    out, l2 = merge_partials(o * 0, ninf, o * 0, ninf)
    assert bool((out == 0).all()) and bool(torch.isinf(l2).all())


def test_lse_merge_sign_mutant_changes_the_merge() -> None:
    o1, o2 = torch.randn(2, 3, dtype=F64), torch.randn(2, 3, dtype=F64)
    l1, l2 = torch.randn(2, dtype=F64), torch.randn(2, dtype=F64)
    good = merge_partials(o1, l1, o2, l2)[1]
    with planted("lse_merge_sign"):
        bad = merge_partials(o1, l1, o2, l2)[1]
    assert not torch.allclose(good, bad)


def test_attention_serial_matches_sdpa() -> None:
    g = _g(1)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=F64) for _ in range(3))
    mask = torch.rand(2, 1, 5, generator=g) > 0.3
    mask[..., 0] = True
    bias = torch.randn(1, 3, 5, 5, generator=g, dtype=F64)
    sdpa_mask = bias.masked_fill(~mask[:, :, None, :], float("-inf"))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask)
    torch.testing.assert_close(attention_serial(q, k, v, key_mask=mask, bias=bias), want)


def test_attention_serial_fully_masked_rows_are_zero_with_finite_grads() -> None:
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=F64, requires_grad=True) for _ in range(3))
    out = attention_serial(q, k, v, key_mask=torch.zeros(1, 1, 3, dtype=torch.bool))
    out.backward(torch.randn_like(out))
    assert bool((out == 0).all())
    assert all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


@pytest.mark.parametrize("with_bias", [False, True])
def test_ring_of_one_matches_serial_forward_and_backward(with_bias: bool) -> None:
    """The ring Function's own backward (P=1, no process group) vs autograd of the twin."""
    g = _g(2)
    q = torch.randn(2, 2, 6, 4, generator=g, dtype=F64)
    k = torch.randn(2, 2, 6, 4, generator=g, dtype=F64)
    v = torch.randn(2, 2, 6, 3, generator=g, dtype=F64)
    mask = torch.rand(2, 1, 6, generator=g) > 0.3
    mask[1] = False
    mask[0, 0, 0] = True
    bias = torch.randn(1, 2, 6, 6, generator=g, dtype=F64) if with_bias else None
    go = torch.randn(2, 2, 6, 3, generator=g, dtype=F64)
    leaves_r = [t.clone().requires_grad_() for t in (q, k, v)]
    leaves_s = [t.clone().requires_grad_() for t in (q, k, v)]
    br = bs = None
    if bias is not None:
        br, bs = bias.clone().requires_grad_(), bias.clone().requires_grad_()
    out_r = ring_attention_local(*leaves_r, Ring((0,), 0), key_mask=mask, bias=br)
    out_s = attention_serial(*leaves_s, key_mask=mask, bias=bs)
    out_r.backward(go)
    out_s.backward(go)
    torch.testing.assert_close(out_r, out_s)
    for a, b in zip(leaves_r, leaves_s, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    if br is not None and bs is not None:
        torch.testing.assert_close(br.grad, bs.grad)


def test_ring_attention_rejects_bad_path_and_shapes() -> None:
    q = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="path"):
        ring_attention_local(q, q, q, Ring((0,), 0), path="fast")
    with pytest.raises(ValueError, match="leading dims"):
        ring_attention_local(q, torch.randn(2, 3, 4), q, Ring((0,), 0))


def test_ring_attention_kernel_path_rejects_fp64() -> None:
    q = torch.randn(1, 3, 4, dtype=F64)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        ring_attention_local(q, q, q, Ring((0,), 0), path="kernel")


# ----------------------------------------------------------------------------- serial twins

def _randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = _g(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return module


@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_triangle_twin_matches_loops(direction: Any) -> None:
    n, c = 4, 3
    tri = _randomize(TriangleMultiplication(c, 2, direction).double(), 3)
    g = _g(4)
    z = torch.randn(n, n, c, generator=g, dtype=F64)
    mask = torch.rand(n, n, generator=g) > 0.3
    zn = tri.ln_in(z)
    m = mask.double()[..., None]
    a = torch.sigmoid(tri.a_gate(zn)) * tri.a_proj(zn) * m
    b = torch.sigmoid(tri.b_gate(zn)) * tri.b_proj(zn) * m
    x = torch.zeros(n, n, 2, dtype=F64)
    for i in range(n):
        for j in range(n):
            for kk in range(n):
                x[i, j] += a[i, kk] * b[j, kk] if direction == "outgoing" else a[kk, i] * b[kk, j]
    want = torch.sigmoid(tri.gate(zn)) * tri.out(tri.ln_out(x))
    torch.testing.assert_close(tri(z, mask), want)


def test_pair_attention_twin_matches_loops() -> None:
    n, c, heads, d = 4, 3, 2, 2
    att = _randomize(PairAttention(c, heads, d).double(), 5)
    g = _g(6)
    z = torch.randn(n, n, c, generator=g, dtype=F64)
    mask = torch.rand(n, n, generator=g) > 0.3
    mask[:, 0] = True
    zn = att.ln(z)
    q, k, v = (lin(zn).reshape(n, n, heads, d) for lin in (att.q, att.k, att.v))
    b = att.bias_proj(zn)  # (j, k, h)
    o = torch.zeros(n, n, heads, d, dtype=F64)
    for i in range(n):
        for j in range(n):
            for h in range(heads):
                s = (k[i, :, h] @ q[i, j, h]) * d ** -0.5 + b[j, :, h]
                s = s.masked_fill(~mask[i], float("-inf"))
                o[i, j, h] = torch.softmax(s, 0) @ v[i, :, h]
    want = att.out(torch.sigmoid(att.gate(zn)) * o.reshape(n, n, heads * d))
    torch.testing.assert_close(att(z, mask), want)


def test_model_config_validates() -> None:
    with pytest.raises(ValueError, match="heads"):
        ModelConfig(heads=0)


def test_make_batch_is_deterministic_and_model_runs() -> None:
    cfg = ModelConfig()
    b1, b2 = (make_batch(5, cfg, generator=_g(7)) for _ in range(2))
    assert torch.equal(b1.pair, b2.pair) and torch.equal(b1.mask, b2.mask) and bool(b1.mask[0])
    assert torch.equal(b1.pair_mask, b1.mask[:, None] & b1.mask[None, :])
    loss = SmallModel(cfg).double()(b1)
    assert loss.ndim == 0 and bool(torch.isfinite(loss))
