"""Cases for issue 22 ("the parity toolkit on real models"), one per finding where the
llama-style recipe (``cpmatrix.recipes.llama``) does not already show it.

Every case is correct unless ``cell.mutant`` switches on one of its declared bugs, except
``always_wrong``, whose unmutated cell fails on purpose (its mutant must then be NOT JUDGED).
``tests/worlds/test_parity_real_models.py`` runs them all with ``--mutants`` in one world.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import (
    DTensor,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from cpmatrix.parity import TensorSpec, check_parity, mutant_on, mutants
from cpmatrix.recipes.llama import LlamaArgs, Transformer, tp_plan

# ---------------------------------------------------------------------------- finding 1


@mutants(rope_conjugated="the CP side rotates q and k by the conjugate RoPE phases")
def llama_rope_tp(cell: Any) -> None:
    """The llama-style model (complex64 RoPE table) with TP + SP on cp1, one forward and
    backward with a random grad_output (no loss parallel: the plain form any version of
    the toolkit takes)."""
    torch.manual_seed(cell.seed)
    args = LlamaArgs()
    tokens = torch.randint(args.vocab_size, (2, 4 * cell.mesh.size(1)), generator=cell.generator)

    def parallelize(module: nn.Module, mesh: Any) -> nn.Module:
        model: Any = module
        for block in model.layers.values():
            block.attention.conjugate_rope = mutant_on(cell, "rope_conjugated")
        parallelize_module(module, mesh["cp1"], tp_plan(model, loss_parallel=False))
        return module

    check_parity(cell, Transformer(args), Transformer(args),
                 inputs={"tokens": TensorSpec.of(tokens, requires_grad=False)},
                 placements={"tokens": None}, prepare_cp=parallelize)

# ---------------------------------------------------------------------------- finding 2


class BatchNorm(nn.Module):
    """BatchNorm over the rows (dim 0) of a plain tensor or of a DTensor sharded on them:
    normalized by the statistics of the whole batch, running statistics updated in place.
    ``local_running_stats`` is the planted bug: the running statistics of this rank's rows
    only (the forward is still right)."""

    def __init__(self, dim: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.int64))
        self.momentum, self.eps = momentum, eps
        self.local_running_stats = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(0)
        var = ((x - mean) ** 2).mean(0)
        with torch.no_grad():
            batch_mean = mean.detach()
            if self.local_running_stats and isinstance(x, DTensor):
                local = x.to_local().mean(0)  # the bug: this rank's rows only
                batch_mean = DTensor.from_local(local, x.device_mesh, [Replicate()])
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(m * batch_mean)
            self.running_var.mul_(1 - m).add_(m * var.detach())
            self.num_batches_tracked.add_(1)
        out: torch.Tensor = (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias
        return out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.bn = BatchNorm(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.bn(self.lin(x))
        return out


@mutants(local_running_stats="BatchNorm's running statistics use only this rank's rows")
def batchnorm_data_parallel(cell: Any) -> None:
    """The batch over cp0; parameters and buffers replicated DTensors (distribute_module)."""
    torch.manual_seed(cell.seed)
    cp = Net()
    cp.bn.local_running_stats = mutant_on(cell, "local_running_stats")
    check_parity(
        cell, Net(), cp,
        inputs={"x": TensorSpec(shape=(4 * cell.mesh.size(0), 6))},
        placements={"x": {"cp0": Shard(0)}},
        prepare_cp=lambda module, mesh: distribute_module(module, mesh["cp0"]),
    )


# ---------------------------------------------------------------------------- finding 3


class _Scaled(torch.autograd.Function):
    """Identity forward; the grad scaled by ``k`` in backward (k != 1: the planted bug)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, k: float) -> torch.Tensor:
        ctx.k = k
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad * ctx.k, None


@mutants(listed_grad_x3="the grad of the second tensor of a list input is 3x too large")
def list_inputs(cell: Any) -> None:
    """Tensors inside a list and a dict are inputs: each side gets its own, grads compared."""
    k = 3.0 if mutant_on(cell, "listed_grad_x3") else 1.0
    xs = [torch.randn(4, 4, generator=cell.generator, dtype=cell.dtype) for _ in range(2)]
    w = torch.randn(4, generator=cell.generator, dtype=cell.dtype)

    def serial(xs: list[torch.Tensor], extra: dict[str, Any]) -> torch.Tensor:
        return xs[0] * extra["w"] + xs[1].sin()

    def cp(xs: list[torch.Tensor], extra: dict[str, Any]) -> torch.Tensor:
        return xs[0] * extra["w"] + _Scaled.apply(xs[1], k).sin()  # type: ignore[no-untyped-call]

    check_parity(cell, serial, cp,
                 inputs={"xs": xs,  # plain tensors in a list: each side gets a copy
                         "extra": {"w": w, "note": "a plain value"}},
                 placements={"xs": [Shard(0)] * cell.mesh.ndim})  # extra.w: replicated


# ---------------------------------------------------------------------------- finding 4


@mutants(no_allreduce="each rank normalizes its shard of the row alone (no all-reduce)")
def long_softmax(cell: Any) -> None:
    """A softmax over an 8192-long row sharded over the mesh (bf16 cells): its values are
    ~1e-4, below any fixed bf16 atol, so only the fp64 twin rule can judge it."""
    def cp(x: DTensor) -> DTensor:
        if mutant_on(cell, "no_allreduce"):
            return DTensor.from_local(x.to_local().softmax(-1), x.device_mesh, x.placements)
        return x.softmax(-1)  # DTensor gathers what the softmax needs (max and sum)

    check_parity(cell, lambda x: x.softmax(-1), cp,
                 inputs={"x": TensorSpec(shape=(2, 8192))},
                 placements={"x": [Shard(1)] * cell.mesh.ndim})


# ---------------------------------------------------------------------------- finding 7


@mutants(also_wrong="a second bug on top of the first")
def always_wrong(cell: Any) -> None:
    """Wrong even without a mutant (the CP side doubles its output): the unmutated cell
    fails, so its mutant cannot be judged."""
    scale = 3.0 if mutant_on(cell, "also_wrong") else 2.0
    check_parity(cell, lambda x: x * 1.0, lambda x: x * scale,
                 inputs={"x": TensorSpec(shape=(4,))}, placements={"x": None})


# ---------------------------------------------------------------------------- finding 8


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 12)
        self.down = nn.Linear(12, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.up(x)))
        return out


@mutants(down_colwise="the down projection is column-parallel: each rank's output is narrow")
def tp_output_shape(cell: Any) -> None:
    """TP MLP on cp1; the planted bug returns local column slices (a wrong output shape)."""
    torch.manual_seed(cell.seed)
    down = ColwiseParallel() if mutant_on(cell, "down_colwise") else RowwiseParallel()
    plan = {"up": ColwiseParallel(use_local_output=False), "down": down}
    check_parity(cell, MLP(), MLP(), inputs={"x": TensorSpec(shape=(5, 8))},
                 placements={"x": None},
                 prepare_cp=lambda m, mesh: parallelize_module(m, mesh["cp1"], plan))


class TiedLM(nn.Module):
    """Embedding and output projection share one weight (tied)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.out = nn.Linear(8, 16, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(torch.tanh(self.emb(tokens)))
        return out


class TiedLMParallel(TiedLM):
    """The same model on replicated DTensor parameters: it takes plain token ids and
    replicates them itself (as a TP embedding does)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mesh = self.emb.weight.device_mesh  # type: ignore[attr-defined]
        return super().forward(DTensor.from_local(tokens, mesh, [Replicate()]))


@mutants(
    not_retied="the weights are not re-tied after parallelizing",
    tokens_default_placement="the integer tokens are left to the default input placement",
)
def tied_embeddings(cell: Any) -> None:
    """The tied weight's vocabulary rows over cp1 (distribute_module makes new parameters:
    a tie is lost), re-tied afterwards; plain integer token ids in."""
    torch.manual_seed(cell.seed)

    def vocab_rows(name: str, module: nn.Module, mesh: Any) -> None:
        if name in ("emb", "out"):  # both views of the tied weight: vocab rows over cp1
            weight: Any = module.weight
            module.weight = nn.Parameter(distribute_tensor(weight.data, mesh, [Shard(0)]))

    def parallelize(module: nn.Module, mesh: Any) -> nn.Module:
        model: Any = distribute_module(module, mesh["cp1"], partition_fn=vocab_rows)
        if not mutant_on(cell, "not_retied"):
            model.out.weight = model.emb.weight  # parallelizing made two parameters of one
        return module

    tokens = torch.randint(16, (2, 5), generator=cell.generator)
    placements = {} if mutant_on(cell, "tokens_default_placement") else {"tokens": None}
    check_parity(cell, TiedLM(), TiedLMParallel(),
                 inputs={"tokens": TensorSpec.of(tokens, requires_grad=False)},
                 placements=placements, prepare_cp=parallelize)
