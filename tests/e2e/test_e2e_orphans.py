"""Nothing orphaned: the processes of an LLM die with the process that made it, whether that one
is killed with SIGKILL (the parent-death signal) or exits without close() (the finalizer)."""
import subprocess
import sys
import time

import pytest

SCRIPT = """
import sys, time
from stepserve import LLM
llm = LLM(model="micro-llama", dtype="float32", kv_cache_gb=0.05, worker_args=["--enforce-eager"])
print(llm.cluster.num_worker_processes, " ".join(str(p.pid) for p in llm.cluster._processes), flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)  # no close()
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()  # a zombie has died; its new parent reaps it
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("end", ["sigkill", "exit"])
def test_llm_processes_die_with_their_parent(end):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, end], stdout=subprocess.PIPE, text=True)
    num_workers, *pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 1 + num_workers and all(alive(p) for p in pids)  # the scheduler and every worker
    if end == "sigkill":
        proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], f"left behind after the parent's {end}"
