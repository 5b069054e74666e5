"""train.strategy=fsdp2: fully sharded data parallel with PyTorch's per-parameter FSDP (`fully_shard`).

Why a second FSDP: Lightning's `fsdp` strategy wraps PyTorch's FullyShardedDataParallel, which runs on CUDA
only. `fully_shard` shards every parameter as a DTensor over a device mesh and runs wherever the process
group does, gloo on CPU included, so a sharded run can be tested on a laptop and then moved to GPUs
unchanged. Lightning drives it through its ModelParallelStrategy; seqdiff uses it for pure data
parallelism (a 1-D mesh over every process, no tensor parallelism).

What is sharded: each transformer block (seqdiff.backbones.BLOCKS) is one unit (its weights are gathered
just before it runs and freed after), and the backbone root holds the rest (embeddings, output head, and the
word embeddings tied to the output in BERT, which must stay in one unit). Checkpoints hold full, unsharded
tensors written by global rank 0 through the run's checkpoint IO (atomic), so `eval`, `sample`, `export`
and `--resume` read them like any other checkpoint.
"""

from __future__ import annotations

import warnings

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from seqdiff.backbones import BLOCKS


class FSDP2Strategy(ModelParallelStrategy):
    """ModelParallelStrategy as pure data parallelism: the data-parallel mesh spans every process."""

    precisions = ("32-true", "bf16-mixed", "bf16-true", "16-true")
    """What Lightning's ModelParallelStrategy accepts (no float16 autocast with a gradient scaler)."""

    def __init__(self) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1, save_distributed_checkpoint=False)

    def setup_environment(self) -> None:
        # Lightning's "auto" puts one data-parallel group per node and tensor parallelism inside the node;
        # here every process is a data-parallel replica.
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def shard_backbone(backbone: nn.Module, mesh) -> None:
    """Apply `fully_shard` to every transformer block, then to the backbone root (idempotent)."""
    from torch.distributed.fsdp import fully_shard

    if is_sharded(backbone):
        return
    # fully_shard warns that a unit returning a view (the output Linear's 3-D result) must not be modified in
    # place; seqdiff's methods never modify backbone outputs in place (the fsdp2 parity test checks the
    # gradients against a single process)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for block in backbone.modules():
        if isinstance(block, BLOCKS):
            fully_shard(block, mesh=mesh)
    fully_shard(backbone, mesh=mesh)


def compile_sharded(backbone: nn.Module) -> int:
    """torch.compile each transformer block's `forward` of a sharded backbone; returns how many were compiled.

    Why not `backbone.compile()` as in an unsharded run: fully_shard's hooks around every block are marked
    `torch._dynamo.disable`, so a compiled whole backbone breaks its graph at each of them and most operators run
    eagerly (the test preset with 4 blocks on CPU: 12 frames, 63 of 234 operator calls captured; the session-22 H200
    run read 18.5% MFU compiled against 18.0% eager). Compiling each block's forward leaves the hooks (which run in
    `nn.Module.__call__`, around `forward`) outside the graph: one graph with no break, shared by every block of the
    same shape, while the root's embeddings and head stay eager (reports/bench/fsdp2_compile;
    tests/test_fsdp2_compile.py). The compiled forward is an instance attribute: parameter names, state dicts and
    checkpoints are unchanged."""
    import torch

    count = 0
    for block in backbone.modules():
        if isinstance(block, BLOCKS) and "forward" not in vars(block):
            block.forward = torch.compile(block.forward)
            count += 1
    return count


def reshard(module: nn.Module) -> None:
    """Put back the sharded parameters of every unit. The root unit keeps its gathered weights after a
    forward pass with no backward (evaluation), so code that reads or writes `parameters()` calls this
    first to see the shards, the same layout every time."""
    from torch.distributed.fsdp import FSDPModule

    if not is_sharded(module):  # nothing to do (and no walk over the modules) outside fsdp2
        return
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()


def unsharded_copy(backbone: nn.Module, build) -> nn.Module | None:
    """On global rank 0, a plain (unsharded) copy of `backbone` with its current weights, made by `build()`;
    None elsewhere. A collective: every process must call it. For code that runs on one process only, or
    calls submodules directly (cached samplers), which a sharded module cannot serve."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(backbone, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    copy = build()
    copy.load_state_dict(state)
    return copy.to(next(backbone.parameters()).device).eval()


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a DTensor shard (a collective: every process must call it); others as they are."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def shard_like(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`tensor` (a whole tensor, the same on every process) laid out like the DTensor `like`; others unchanged."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(like, DTensor) and not isinstance(tensor, DTensor):
        return distribute_tensor(tensor.to(like.device), like.device_mesh, like.placements)
    return tensor
