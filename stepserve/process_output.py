"""What a local cluster's child processes print, read back by the process that started them.

stdout carries the lines the launcher acts on: the scheduler's and the gateway's ready lines
(their addresses) and the workers' status lines ("stepserve worker: compiling ..."), which the
launcher relays to its user. stderr is each process's log: kept in a temporary file (echoed to
this terminal too unless quiet), so that a process that dies is explained by its own last
error line, not by "see the log".
"""
import os
import re
import subprocess
import sys
import threading
from typing import Callable

# A worker's stdout line about what it is doing (worker_svc prints them; the launcher relays).
WORKER_STATUS = re.compile(r"stepserve worker: (.*)")
# The last line of a Python traceback: "ValueError: ...", "torch.OutOfMemoryError: ...".
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b.*")


def tee_stderr(proc: subprocess.Popen, log) -> threading.Thread:
    """Copies the process's stderr pipe into its log file and onto this process's stderr."""
    def copy() -> None:
        try:
            for line in iter(proc.stderr.readline, b""):
                log.write(line)
                log.flush()
                sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()
        except ValueError:  # the log was closed: the cluster stopped
            pass
        proc.stderr.close()
    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def follow_stdout(proc: subprocess.Popen, echo: bool, ready: re.Pattern | None = None,
                  on_status: Callable[[str], None] | None = None) -> list[re.Match]:
    """Reads the process's stdout on a thread until it closes. Returns a list that receives the
    first match of `ready`; status lines go to on_status; other lines are echoed if `echo`."""
    found: list[re.Match] = []
    stream = proc.stdout

    def read() -> None:
        for line in iter(stream.readline, b""):
            text = line.decode(errors="replace")
            match = ready.search(text) if ready is not None and not found else None
            status = WORKER_STATUS.match(text)
            if match:
                found.append(match)
            elif status and on_status is not None:
                on_status(status.group(1).rstrip())
            elif echo:
                print(text, end="", flush=True)
        stream.close()

    threading.Thread(target=read, daemon=True).start()
    return found


def tail(log, num_bytes: int = 4000) -> str:
    """The last num_bytes of a process's log."""
    if log is None:
        return ""
    log.seek(0, os.SEEK_END)
    log.seek(max(0, log.tell() - num_bytes))
    return log.read().decode(errors="replace")


def last_error_line(log_text: str) -> str:
    """The line that says why a process died: the last exception line of a traceback (its
    message), else the last line of the log."""
    lines = [line.rstrip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    return lines[-1] if lines else "(it wrote nothing to its log)"
