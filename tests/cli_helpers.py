"""Test tools for the `stepserve` command: how tests run it, a small cluster's flags, and the
processes a command left running."""
import contextlib
import signal
import subprocess
import sys
from typing import Iterator

STEPSERVE = [sys.executable, "-m", "stepserve.cli"]
SMALL = ["--model", "micro-llama", "--dtype", "float32", "--kv-cache-gb", "0.05", "--enforce-eager"]


def pids(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


@contextlib.contextmanager
def until_ctrl_c(command: str, *args: str) -> Iterator[str]:
    """`stepserve COMMAND ARGS...` in a session of its own, its output read until its ready line
    (`stepserve COMMAND: ...`, given to the block; "" when it ended first); after the block,
    Ctrl-C (SIGINT) must end it with status 0. Killed if it is still running either way."""
    proc = subprocess.Popen([*STEPSERVE, command, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        ready = next((line for line in proc.stdout if line.startswith(f"stepserve {command}:")), "")
        yield ready
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
