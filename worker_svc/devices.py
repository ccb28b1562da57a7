"""`--devices all`: one worker process per visible CUDA device, so one container serves a
multi-GPU host. Each process is its own data-parallel replica (its own worker id, block pool and
batch); with no visible GPU the caller runs one CPU worker instead."""
import signal
import subprocess
import sys

import torch


def num_visible_cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def child_argv(argv: list[str], index: int, worker_id: str | None) -> list[str]:
    """The parent's arguments without --devices, pinned to cuda:index (argparse: last wins)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--devices":
            skip = True  # and its value
        elif not arg.startswith("--devices="):
            out.append(arg)
    out += ["--device", f"cuda:{index}"]
    if worker_id:  # an explicit id would otherwise be shared by every replica
        out += ["--worker-id", f"{worker_id}/cuda:{index}"]
    return out


def run_per_device(argv: list[str], num_devices: int, worker_id: str | None) -> int:
    """Starts the workers, forwards SIGTERM/SIGINT to them, waits; the worst exit code."""
    procs = [subprocess.Popen([sys.executable, "-m", "worker_svc", *child_argv(argv, i, worker_id)])
             for i in range(num_devices)]

    def forward(signum, _frame):
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return max(abs(proc.wait()) for proc in procs)
