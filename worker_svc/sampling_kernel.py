"""The C++ sampling kernel (csrc/sample_rows.cpp: bitmask, temperature, top-k, top-p, min-p and the
draw of every row in one call), built on first use (native_build.py). Where it cannot be built
the sampler runs its torch path."""
import functools

from worker_svc import native_build


@functools.cache
def load() -> object | None:
    """The extension module (its `sample_rows`), or None where it does not build."""
    return native_build.build(["sample_rows.cpp"], "stepserve_sample_rows", "sampling kernel")
