"""torch's CPU allocator for a generative CPU worker (csrc/host_allocator.cpp): blocks of 1 MiB and
more are mapped once and kept, when freed, for the next request of about their size, so a step's
large activations are not faulted in afresh in every layer of every step. Built on first use
(native_build.py); where it cannot be built, torch keeps its own allocator.
"""
import functools

from worker_svc import native_build

CACHE_LIMIT_BYTES = 1 << 30  # freed large blocks kept at most: a long prefill's activations, with room


@functools.cache
def load() -> object | None:
    """The extension module (`install`, `stats`), or None where it does not build."""
    return native_build.build(["host_allocator.cpp"], "stepserve_host_allocator", "host block cache")


def install(limit_bytes: int = CACHE_LIMIT_BYTES) -> bool:
    """Makes the block cache this process's CPU allocator; False where it could not be built."""
    module = load()
    if module is None:
        return False
    module.install(limit_bytes)
    return True
