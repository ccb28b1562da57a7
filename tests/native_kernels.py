"""The worker's C++ kernels in tests: a test needs its kernel built. It skips only where this
machine has no C++ compiler (the worker then runs plain torch, as it says in its log); a kernel
that fails to build where a compiler is present fails the test, rather than hiding behind a skip."""
import shutil

import pytest


def built(load, what: str):
    """load(): the kernel's loader (None where it did not build); what: the kernel in words."""
    module = load()
    if module is None:
        if shutil.which("c++") is None:
            pytest.skip(f"no C++ compiler here to build the {what}")
        pytest.fail(f"the {what} did not build although a C++ compiler is here (the build's error is logged)")
    return module
