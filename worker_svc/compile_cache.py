"""Where compiled artefacts persist across worker restarts: torch.compile's (inductor's) graph
and kernel caches, and our own C++ kernels. A second start of the same model on the same
machine finds them and skips most of the compile.

    <root>/inductor    TORCHINDUCTOR_CACHE_DIR: FX graphs and generated C++ kernels
    <root>/extensions  torch.utils.cpp_extension builds (worker_svc/csrc)
"""
import os

DEFAULT_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "stepserve")

_root = DEFAULT_ROOT


def configure(root: str | None) -> str:
    """Point every compile cache at `root` (None: the default). Call before the first compile."""
    global _root
    _root = os.path.abspath(os.path.expanduser(root or DEFAULT_ROOT))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_root, "inductor")
    os.makedirs(os.environ["TORCHINDUCTOR_CACHE_DIR"], exist_ok=True)
    return _root


def root() -> str:
    return _root


def extensions_dir() -> str:
    path = os.path.join(_root, "extensions")
    os.makedirs(path, exist_ok=True)
    return path
