"""Builds the worker's C++ kernels (csrc/) with torch.utils.cpp_extension into the compile cache,
so later starts only load them.

A build is tuned for this CPU (-march=native), so a module's name carries a digest of its
source, of the headers it shares (csrc/*.h) and of the CPU's flags: a cache shared between
machines never loads a kernel built for another CPU. It is built from copies inside its build
folder: ninja's command names the source path, so checkouts at different paths would otherwise
keep rebuilding each other's kernel. Where a kernel cannot be built (no C++ compiler) the
caller falls back to plain torch.
"""
import glob
import hashlib
import logging
import os
import shutil
import time

from worker_svc import compile_cache, status

log = logging.getLogger(__name__)
CSRC = os.path.join(os.path.dirname(__file__), "csrc")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def build(sources: list[str], module_prefix: str, what: str) -> object | None:
    """The extension module built from csrc/SOURCE for each of sources (one of them binds the
    module), or None where it does not build. what: the kernel in words, for the status line of a
    first build and the log."""
    files = [*(os.path.join(CSRC, name) for name in sources), *sorted(glob.glob(os.path.join(CSRC, "*.h")))]
    digest = hashlib.sha256(_cpu_flags().encode())
    for path in files:
        with open(path, "rb") as f:
            digest.update(f.read())
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load as load_extension
        name = f"{module_prefix}_{digest.hexdigest()[:12]}"
        build_dir = os.path.join(compile_cache.extensions_dir(), name)
        os.makedirs(build_dir, exist_ok=True)
        if not all(os.path.exists(os.path.join(build_dir, os.path.basename(p))) for p in files):
            status.say(f"building the C++ {what} (once per machine and CPU: about half a minute)")
            for path in files:
                copy = os.path.join(build_dir, os.path.basename(path))
                shutil.copyfile(path, copy + ".partial")
                os.replace(copy + ".partial", copy)
        module = load_extension(name, [os.path.join(build_dir, source) for source in sources], build_directory=build_dir,
                                extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-strict-aliasing"],
                                extra_ldflags=["-fopenmp"])
    except Exception as exc:  # noqa: BLE001 - no compiler, headers, ninja: run without it
        log.warning("C++ %s unavailable (%s: %s); using plain torch", what, type(exc).__name__, exc)
        return None
    log.info("%s ready in %.1f s", what, time.perf_counter() - start)
    return module
