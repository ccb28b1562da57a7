"""The worker's C++ step kernels on the CPU, one extension built on first use (native_build.py):
a layer's K/V write and its paged decode attention in one call (csrc/paged_decode_attention.cpp,
`write_kv_and_decode`) and the linear layers' op (csrc/small_batch_linear.cpp,
`torch.ops.stepserve.linear`: linear_kernel.py), which share one pool of threads (csrc/spin_pool.h)
for a decode step's few rows. Where it cannot be built, attention and the linear layers fall back
to plain torch.
"""
import functools

from worker_svc import native_build

SOURCES = ["paged_decode_attention.cpp", "small_batch_linear.cpp"]


@functools.cache
def load() -> object | None:
    """The extension module (its `write_kv_and_decode`; loading it registers stepserve::linear), or
    None where it does not build."""
    return native_build.build(SOURCES, "stepserve_step_kernels", "step kernels")
