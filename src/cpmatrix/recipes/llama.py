"""Recipe: a small llama-style transformer with tensor/sequence parallel, FSDP2 and loss
parallel, the way torchtitan lays them out (written here from the published architecture;
no upstream code).

The model: token embeddings, ``n_layers`` pre-norm blocks (RMSNorm, attention with rotary
embeddings, SwiGLU feed-forward), a final RMSNorm and an output projection. The rotary
table ``freqs_cis`` is a **complex64 buffer** (``torch.polar``), applied through
``view_as_complex``, as in llama: a toolkit that cast it to a real dtype would run a model
without rotary embeddings on both sides (the toolkit keeps it complex: complex128 in fp64
cells).

The plan (:func:`tp_plan`) is Megatron-style TP with sequence parallel on ``cp1``: the
embedding row-wise with its output sequence-sharded, every norm ``SequenceParallel``,
q/k/v and w1/w3 column-wise, wo and w2 row-wise back to sequence shards, the output
projection column-wise: with **loss parallel** its logits stay sharded over the vocabulary
(a DTensor) and the loss runs under ``loss_parallel()``, which must cover the backward too:
``check_parity(..., context=loss_parallel)`` enters it around the CP side's forward, loss
and backward.

Cases:

- :func:`llama_tp_loss_parallel` - TP + SP + loss parallel on ``cp1`` (``cp0`` replicas on
  2x2): 2 SGD steps with a cross-entropy loss, the per-step loss, first-step grads and
  weight deltas compared. Planted bug ``rope_conjugated``: the CP side rotates by the
  conjugate of the RoPE table (a sign error in the rotation): killed by ``output`` (it
  survives wherever the table was cast to real: then there is no rotation to get wrong).
- :func:`llama_fsdp_tp` - FSDP2 over ``cp0`` on top of the TP plan over ``cp1`` (2-D
  parameters), the batch sharded over ``cp0``. Its weight grads are sums over every token
  of the batch that cancel: fp32's fixed ``atol=1e-5`` fails correct code here, the fp64
  twin rule does not (``docs/parity.md``). Planted bug ``fsdp_mean_grads``: FSDP's
  default divides the gradients by the ``cp0`` size (a mean) while the check's loss is a
  sum: killed by ``param_grad``, with the hint "CP = 0.5 x serial everywhere: mean vs sum
  over `cp0` or `cp1`?" (on 2x2 both axes have that size).

Copy it as a starting point for a transformer: replace :class:`Transformer` by yours and
keep :func:`tp_plan` in step with its module names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants

__all__ = [
    "DataParallel",
    "LlamaArgs",
    "Transformer",
    "apply_rotary_emb",
    "llama_fsdp_tp",
    "llama_tp_loss_parallel",
    "precompute_freqs_cis",
    "tp_plan",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaArgs:
    """The model's size; the defaults are a CPU-sized debug model."""

    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 64
    hidden: int = 64
    max_seq_len: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ValueError(f"dim {self.dim} must split into {self.n_heads} heads of an "
                             f"even width (RoPE rotates pairs)")


def precompute_freqs_cis(head_dim: int, end: int, theta: float) -> torch.Tensor:
    """The rotary table: ``(end, head_dim / 2)`` complex64 unit phases ``e^{i t f_k}``."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(end, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each pair of channels of q and k by its position's phase (complex product).

    ``xq``/``xk``: ``(batch, seq, heads, head_dim)``; ``freqs_cis``: ``(seq, head_dim / 2)``
    complex. The product runs in the table's precision (float32 for complex64, float64 for
    complex128) and comes back in the input's dtype.
    """
    real = freqs_cis.real.dtype
    shape = freqs_cis.view(1, xq.shape[1], 1, xq.shape[-1] // 2)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.to(real).reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * shape).flatten(3).to(x.dtype)

    return rotate(xq), rotate(xk)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        out: torch.Tensor = normed * self.weight
        return out


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)
        #: The planted bug ``rope_conjugated`` (switched on for the CP side only).
        self.conjugate_rope = False

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        # -1 heads: under TP each rank holds n_heads / tp of them
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        table = freqs_cis[:seq].conj() if self.conjugate_rope else freqs_cis[:seq]
        q, k = apply_rotary_emb(q, k, table)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(bs, seq, -1))
        return result


class FeedForward(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.hidden, bias=False)
        self.w2 = nn.Linear(args.hidden, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class Block(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


class Transformer(nn.Module):
    """Tokens ``(batch, seq)`` (int64) -> logits ``(batch, seq, vocab)``."""

    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): Block(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # model state that is not a parameter: computed here, not loaded (persistent=False)
        self.register_buffer(
            "freqs_cis",
            precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len, args.rope_theta),
            persistent=False,
        )
        for p in self.parameters():  # small and O(1): fp32's rounding stays visible
            nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[-1]) if p.ndim > 1 else 0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        out: torch.Tensor = self.output(self.norm(h))
        return out


def tp_plan(model: Transformer, *, loss_parallel: bool) -> dict[str, Any]:
    """Megatron TP + sequence parallel, torchtitan's layout, by module name."""
    plan: dict[str, Any] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel),
    }
    for name in model.layers:
        p = f"layers.{name}."
        plan.update({
            p + "attention_norm": SequenceParallel(),
            p + "attention": PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            p + "attention.wq": ColwiseParallel(),
            p + "attention.wk": ColwiseParallel(),
            p + "attention.wv": ColwiseParallel(),
            p + "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            p + "ffn_norm": SequenceParallel(),
            p + "feed_forward": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            p + "feed_forward.w1": ColwiseParallel(),
            p + "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            p + "feed_forward.w3": ColwiseParallel(),
        })
    return plan


def _tokens(cell: Any, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """Token ids from ``cell.generator``: the same on every rank."""
    return torch.randint(vocab, (batch, seq), generator=cell.generator)


def _sgd(params: Any) -> torch.optim.Optimizer:
    """SGD with momentum, not AdamW: Adam divides out a gradient scaled by the world size
    (the bug ``weight_delta`` exists to catch) and amplifies rounding without bound where
    a moment cancels (docs/parity.md, "The fp64 twin")."""
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9)


@mutants(rope_conjugated="the CP side rotates q and k by the conjugate RoPE phases")
def llama_tp_loss_parallel(cell: Any) -> None:
    """TP + SP + loss parallel on cp1: 2 SGD steps of a cross-entropy loss."""
    torch.manual_seed(cell.seed)
    args = LlamaArgs()
    seq = 4 * cell.mesh.size(1)  # the sequence shards evenly over cp1
    tokens = _tokens(cell, 2, seq + 1, args.vocab_size)
    inputs, labels = tokens[:, :-1], tokens[:, 1:].reshape(-1)

    def cross_entropy(logits: torch.Tensor) -> torch.Tensor:
        # serial: plain logits; CP: a DTensor sharded over the vocabulary, under loss_parallel
        return F.cross_entropy(logits.flatten(0, 1), labels, reduction="sum")

    def parallelize(module: nn.Module, mesh: Any) -> nn.Module:
        model: Any = module
        for block in model.layers.values():
            block.attention.conjugate_rope = mutant_on(cell, "rope_conjugated")
        parallelize_module(module, mesh["cp1"], tp_plan(model, loss_parallel=True))
        return module

    check_parity(
        cell, Transformer(args), Transformer(args),
        inputs={"tokens": TensorSpec.of(inputs, requires_grad=False)},
        placements={"tokens": None},  # plain ids: the plan's embedding distributes them
        prepare_cp=parallelize,
        optimizer=_sgd, steps=2, loss=cross_entropy,
        context=loss_parallel,  # around the CP side's forward, loss and backward
    )


class DataParallel(nn.Module):
    """The same model (same parameter names) on this rank's rows of a batch sharded over
    ``cp0``: the rows through the (tensor parallel) model, the logits back as a DTensor."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        assert isinstance(tokens, DTensor), "the batch is a DTensor sharded over cp0"
        logits = self.model(tokens.to_local())
        shape = torch.Size((*tokens.shape, logits.shape[-1]))
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(logits, tokens.device_mesh, tokens.placements,
                                  shape=shape, stride=stride)


class Serial(nn.Module):
    """The serial twin of :class:`DataParallel` (same parameter names: ``model.*``)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model(tokens)
        return out


@mutants(fsdp_mean_grads="FSDP divides the gradients by the cp0 size (a mean)")
def llama_fsdp_tp(cell: Any) -> None:
    """FSDP2 over cp0 after TP + SP over cp1; the batch sharded over cp0."""
    torch.manual_seed(cell.seed)
    args = LlamaArgs(dim=int(cell.params.get("dim", 64)), hidden=128, vocab_size=128,
                     max_seq_len=128)
    seq = int(cell.params.get("seq", 64))
    tokens = _tokens(cell, 2 * cell.mesh.size(0), seq, args.vocab_size)

    def parallelize(module: nn.Module, mesh: Any) -> nn.Module:
        model: Any = module
        parallelize_module(model.model, mesh["cp1"], tp_plan(model.model, loss_parallel=False))
        units = [fully_shard(block, mesh=mesh["cp0"]) for block in model.model.layers.values()]
        units.append(fully_shard(model, mesh=mesh["cp0"]))
        for unit in units:
            if not mutant_on(cell, "fsdp_mean_grads"):
                unit.set_gradient_divide_factor(1.0)  # the check's loss sums over the batch
            # gloo has no PREMUL_SUM (see fsdp_tp.py): plain sums, divided afterwards
            unit.set_force_sum_reduction_for_comms(True)
        return module

    check_parity(
        cell, Serial(Transformer(args)), DataParallel(Transformer(args)),
        inputs={"tokens": TensorSpec.of(tokens, requires_grad=False)},
        placements={"tokens": {"cp0": Shard(0)}},  # the batch over the data-parallel axis
        prepare_cp=parallelize,
    )
