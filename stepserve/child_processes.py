"""Processes started for a local cluster die with the process that started them, whatever
kills it: a Linux parent-death signal (SIGKILL) set in each child between fork and exec, and,
for a clean exit that forgot close(), a finalizer (weakref.finalize runs at interpreter exit)."""
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
# Loaded here, in the parent: the child, between fork and exec, only makes the call.
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True) if sys.platform == "linux" else None


def _die_with_parent(parent_pid: int):
    def set_parent_death_signal() -> None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before the call: nobody would send it
            os._exit(1)
    return set_parent_death_signal


def spawn(argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """subprocess.Popen, with the child bound to this process's life (on Linux).

    The signal comes when the thread that spawned the child ends, so spawn from a thread that
    lives as long as the cluster (the main thread, as LLM and the CLI do)."""
    if _libc is not None:
        popen_kwargs["preexec_fn"] = _die_with_parent(os.getpid())
    return subprocess.Popen(argv, **popen_kwargs)


def stop_all(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """SIGTERM to every live one, then SIGKILL to any still alive after timeout_s."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stderr_file = getattr(proc, "stderr_file", None)
        if stderr_file is not None:
            stderr_file.close()
