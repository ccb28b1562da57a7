"""How many CPU threads a worker's torch uses: one for a model whose per-token work is tiny.

torch's default is one OpenMP thread per core. Every operator of a step then forks over the
threads and meets at a barrier, where a thread that is done spins for the other. For a model
like micro-llama (hidden 128, 2 layers, vocab 1000: 2.3 MB of float32 weights) a decode step's
operators last microseconds, so the barriers are most of the step; and the spinning thread
holds a core the scheduler's and the client's processes need, and, on a host with more work
than cores, the time slice of the thread it waits for. Measured on a 2-vCPU AMD EPYC
(avx512_bf16), micro-llama bfloat16, `stepserve bench throughput --num-prompts 3000`, load ~5:
62.7 requests/s with two threads against 1,240 with one (a 232 ms mean step against 11.9 ms).

A model whose step is matrix multiplication (tiny-llama: 78 MB, most of it the 32k-token
embedding and head) keeps every core: there the threads share real work. Its threads wait passively
(the worker process sets OMP_WAIT_POLICY=PASSIVE before torch loads, unless set): by default
libgomp spins at each barrier, which on a host with more runnable threads than cores burns the
time slice the late thread needs. tiny-llama bfloat16, 400 prompts, same host, load 4.6-7.6,
two runs each: spinning 26.9 / 18.7 requests/s, PASSIVE 172.3 / 150.8 (and 108.5 / 90.2 in a
later pair), one thread 162.9 / 112.0, GOMP_SPINCOUNT=10000 47.2 / 71.3. A quiet host would pay
a futex wake-up per parallel region (microseconds); no quiet host was available to measure it.

The size is worker_svc/model_size.py's weight_bytes, the measure stepserve/default_replicas.py
takes too; the threshold is this module's own, since the replica rule answers another question
(one-thread replicas against one replica of many threads).
"""
import logging

import torch

from worker_svc.model_size import weight_bytes

log = logging.getLogger(__name__)
# Weight bytes below which one thread runs a step faster than several: 2M float32 weights,
# between micro-llama's 2.3 MB and tiny-llama's 78 MB.
ONE_THREAD_BELOW_BYTES = 8 << 20


def choose_threads(model: str, device: torch.device, threads: int | None) -> None:
    """Sets torch's thread count for this process: `threads` if given, else one thread for a
    CPU model (a preset name or a folder) under ONE_THREAD_BELOW_BYTES, else torch's default.
    Process-wide, as torch's setting is: a worker holds one model."""
    if threads:
        torch.set_num_threads(threads)
    elif device.type == "cpu" and weight_bytes(model) < ONE_THREAD_BELOW_BYTES:
        log.info("one CPU thread: %d bytes of weights is too little work to share", weight_bytes(model))
        torch.set_num_threads(1)
