"""How many CPU threads a worker's torch uses: one for a model whose per-token work is tiny.

torch's default is one OpenMP thread per core. Every operator of a step then forks over the
threads and meets at a barrier, where a thread that is done spins for the other. For a model
like micro-llama (hidden 128, 2 layers, vocab 1000: ~0.5M weights per token) a decode step's
operators last microseconds, so the barriers are most of the step; and the spinning thread
holds a core the scheduler's and the client's processes need, and, on a host with more work
than cores, the time slice of the thread it waits for. Measured on a 2-vCPU AMD EPYC
(avx512_bf16), micro-llama bfloat16, `stepserve bench throughput --num-prompts 3000`, load ~5:
62.7 requests/s with two threads against 1,240 with one (a 232 ms mean step against 11.9 ms).

A model whose step is matrix multiplication (tiny-llama: ~11M weights per token, most of it the
32k-token head) keeps every core: there the threads share real work. Its threads wait passively
(the worker process sets OMP_WAIT_POLICY=PASSIVE before torch loads, unless set): by default
libgomp spins at each barrier, which on a host with more runnable threads than cores burns the
time slice the late thread needs. tiny-llama bfloat16, 400 prompts, same host, load 4.6-7.6,
two runs each: spinning 26.9 / 18.7 requests/s, PASSIVE 172.3 / 150.8 (and 108.5 / 90.2 in a
later pair), one thread 162.9 / 112.0, GOMP_SPINCOUNT=10000 47.2 / 71.3. A quiet host would pay
a futex wake-up per parallel region (microseconds); no quiet host was available to measure it.
"""
import logging

import torch
from torch import nn

from worker_svc.models.layers import Embedding

log = logging.getLogger(__name__)
# Weights a token multiplies through, below which one thread runs a step faster than several.
ONE_THREAD_BELOW_WEIGHTS = 2_000_000


def weights_per_token(model: nn.Module) -> int:
    """The matrix weights one token's forward multiplies: every matrix (or stack of experts)
    but the embedding tables, which are lookups; a head tied to the input embedding counts."""
    lookups = {id(module.weight) for module in model.modules() if isinstance(module, Embedding)}
    head = getattr(model, "lm_head_weight", None)
    return sum(p.numel() for p in model.parameters()
               if p.dim() >= 2 and (id(p) not in lookups or p is head))


def choose_threads(model: nn.Module, device: torch.device, threads: int | None) -> None:
    """Sets torch's thread count for this process: `threads` if given, else one thread for a
    CPU model under ONE_THREAD_BELOW_WEIGHTS, else torch's default. Process-wide, as torch's
    setting is: a worker holds one model."""
    if threads:
        torch.set_num_threads(threads)
    elif device.type == "cpu" and weights_per_token(model) < ONE_THREAD_BELOW_WEIGHTS:
        log.info("one CPU thread: %d weights per token is too little work to share", weights_per_token(model))
        torch.set_num_threads(1)
