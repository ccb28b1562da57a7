"""The C++ step kernel of the CPU attention (csrc/paged_decode_attention.cpp: a layer's K/V write
and its paged decode attention in one call), built on first use.

Built with torch.utils.cpp_extension into the compile cache, so later starts only load it.
The build is tuned for this CPU (-march=native), so its name carries a digest of the source and
of the CPU's flags: a cache shared between machines never loads a kernel built for another CPU.
It is built from a copy of the source inside its build folder: ninja's command names the source
path, so checkouts at different paths would otherwise keep rebuilding each other's kernel.
Where it cannot be built (no C++ compiler) the attention falls back to plain torch.
"""
import hashlib
import logging
import os
import shutil
import time

from worker_svc import compile_cache, status

log = logging.getLogger(__name__)
_SOURCE = os.path.join(os.path.dirname(__file__), "csrc", "paged_decode_attention.cpp")
_module = None
_tried = False


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def load() -> object | None:
    """The extension module (its `write_kv_and_decode`), or None where it does not build."""
    global _module, _tried
    if _tried:
        return _module
    _tried = True
    with open(_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read() + _cpu_flags().encode()).hexdigest()[:12]
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load as load_extension
        name = f"stepserve_decode_attention_{digest}"
        build_dir = os.path.join(compile_cache.extensions_dir(), name)
        os.makedirs(build_dir, exist_ok=True)
        source = os.path.join(build_dir, os.path.basename(_SOURCE))
        if not os.path.exists(source):
            status.say("building the C++ decode attention kernel (once per machine and CPU: about half a minute)")
            shutil.copyfile(_SOURCE, source + ".partial")
            os.replace(source + ".partial", source)
        _module = load_extension(name, [source], build_directory=build_dir,
                                 extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-strict-aliasing"],
                                 extra_ldflags=["-fopenmp"])
    except Exception as exc:  # noqa: BLE001 - no compiler, headers, ninja: run without it
        log.warning("C++ decode attention kernel unavailable (%s: %s); using plain torch",
                    type(exc).__name__, exc)
        return None
    log.info("decode attention kernel ready in %.1f s", time.perf_counter() - start)
    return _module
