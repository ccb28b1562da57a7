"""The C++ prefill attention of the CPU (csrc/prefill_attention.cpp: flash-style causal attention
of a step's bfloat16 prefill tokens over their paged KV blocks, on AVX512-BF16's dot products),
built on first use (native_build.py). Where it cannot be built, or `supports(head_dim)` says the
CPU or the head size is not for it, prefills run torch's scaled_dot_product_attention.
"""
import functools

from worker_svc import native_build


@functools.cache
def load() -> object | None:
    """The extension module (`prefill_attention`, `supports`), or None where it does not build."""
    return native_build.build(["prefill_attention.cpp"], "stepserve_prefill_attention", "prefill attention kernel")
