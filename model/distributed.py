"""DistributedDataParallel plumbing: the same `seqserve train` runs alone or under torchrun."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world() -> World:
    """Joins the process group torchrun describes (gloo on CPU, nccl on GPU); a plain run is a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return World(rank=dist.get_rank(), size=dist.get_world_size())


def wrap(model: torch.nn.Module, world: World) -> torch.nn.Module:
    if world.size == 1:
        return model
    return torch.nn.parallel.DistributedDataParallel(model)


def mean_across(value: float, world: World) -> float:
    if world.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / world.size


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()


def shutdown(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
