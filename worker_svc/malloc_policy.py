"""The host allocator's policy for a process that runs steps: large blocks are mapped, never heaped.

A CPU step allocates its activations ([tokens, hidden] and wider) fresh each forward, and their
sizes follow the step's token count, which differs from step to step (an embedding batch of
varied prompt lengths: nearly every step a new size). glibc serves blocks over its mmap
threshold with mmap and returns them to the system on free, but by default it raises that
threshold to the size of each mapped block freed (up to 32 MiB): after the first step every
activation lands in the heap, where blocks of ever-different sizes fragment it and freed space is
rarely returned. The worker's resident memory then grew with the requests it served (about
1.5 KB a request over 1M embedding requests), with none of it held by Python or the runner's
tables. A fixed threshold (glibc's own starting value) keeps them mapped: measured on a BERT
of hidden size 64, 10k requests of 3-99 tokens, eager: +87 MiB -> +6 MiB, the same step time.

A pooling worker takes it (ModelRunner, once it knows the model pools): its every step is a
prefill of a new size. A generative worker does not: its decode steps would then map and fault in
their activations afresh each step, and tiny-llama's throughput fell 10-18% with it
(`stepserve bench throughput --model tiny-llama --num-prompts 3000`, alternating, 2 rounds, AMD
EPYC 2 vCPUs avx512_bf16, a loaded host: 114 / 144 requests/s against 140 / 161 with the heap),
while its compiled steps pad the token axis to a few buckets, whose sizes the heap reuses. Its
blocks of 1 MiB and more bypass glibc: the worker process makes the host block cache
(host_allocator.py) torch's CPU allocator.

MALLOC_MMAP_THRESHOLD_ in the environment, if set, is the user's choice and stands.
"""
import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)
M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's default before its dynamic adjustment


def map_large_blocks() -> bool:
    """Fixes glibc's mmap threshold for this process (see the module docstring); False where the
    C library is not glibc or the user set the threshold."""
    if platform.libc_ver()[0] != "glibc" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    if not ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        log.warning("mallopt(M_MMAP_THRESHOLD) refused: host memory may grow with the requests served")
        return False
    return True
