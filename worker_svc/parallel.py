"""Tensor parallelism inside one worker group: who this rank is, and the collectives it needs.

N worker processes (ranks) form one group: the scheduler sends each the same plan; each holds
1/N of every attention layer's heads and of every MLP's intermediate features, and the partial
outputs of the row-parallel projections are summed by all_reduce. Sampling runs on rank 0 only
and its token ids are broadcast, so every rank appends exactly the same tokens, seeded or not.

One group per process: it is torch.distributed's default group (gloo on CPU, nccl on CUDA).
"""
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlparse

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    size: int = 1
    rank: int = 0

    def __post_init__(self):
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not in a group of {self.size}")

    @property
    def is_driver(self) -> bool:
        """Rank 0 samples and answers the scheduler."""
        return self.rank == 0

    def divide(self, num: int, what: str) -> int:
        """This rank's share of `num` (heads, features); it must split evenly."""
        if num % self.size:
            raise ValueError(f"{what} ({num}) is not divisible by tensor_parallel_size {self.size}")
        return num // self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks, in place."""
        if self.size > 1:
            dist.all_reduce(x)
        return x

    def min_over_ranks(self, value: int, device: torch.device) -> int:
        """The ranks' capacities can differ (free GPU memory); the group offers the least."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def broadcast_tokens(self, tokens: np.ndarray | None, num_tokens: int,
                         device: torch.device) -> np.ndarray:
        """Rank 0's sampled token ids [num_tokens] on every rank.

        Rank 0 passes tokens=None when its sampling failed: the others then raise instead of
        waiting forever for a broadcast that would never come.
        """
        if self.size == 1:
            return tokens
        buf = torch.zeros(num_tokens + 1, dtype=torch.int64, device=device)  # [ok, *tokens]
        if self.is_driver and tokens is not None:
            buf[0] = 1
            buf[1:] = torch.from_numpy(tokens).to(device)
        dist.broadcast(buf, src=0)
        if self.is_driver:
            return tokens
        if not buf[0].item():
            raise RuntimeError("rank 0 failed to sample this step")
        return buf[1:].cpu().numpy()


def init_process_group(tp: TensorParallel, address: str, device: torch.device) -> None:
    """Joins the group; returns once every rank has joined. address: tcp://host:port."""
    if tp.size == 1:
        return
    if not address:
        raise ValueError("--dist-init-address is required when --tensor-parallel-size > 1")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=address, world_size=tp.size, rank=tp.rank)


def default_group_id(address: str) -> str:
    """Every rank of a group is given the same init address, so it names the group. A loopback
    address only means something on its host, so the host name is added to keep two hosts'
    groups apart."""
    host = urlparse(address).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return f"tp:{socket.gethostname()}:{address}" if loopback else f"tp:{address}"
