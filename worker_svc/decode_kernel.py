"""The C++ step kernel of the CPU attention (csrc/paged_decode_attention.cpp: a layer's K/V write
and its paged decode attention in one call), built on first use (native_build.py). Where it
cannot be built the attention falls back to plain torch.
"""
import functools

from worker_svc import native_build


@functools.cache
def load() -> object | None:
    """The extension module (its `write_kv_and_decode`), or None where it does not build."""
    return native_build.build("paged_decode_attention.cpp", "stepserve_decode_attention", "decode attention kernel")
