"""A first run says what it is doing: the model line (model, dtype, device, compiled or not) on
stderr, a progress bar when stderr is a terminal, and stdout left to the results (`--json`
stays parseable). Real processes; the terminal is a pseudo-terminal."""
import fcntl
import json
import os
import pty
import struct
import subprocess
import termios
import threading

from tests.cli_helpers import SMALL, STEPSERVE


def test_bench_throughput_says_what_it_runs_shows_progress_on_a_terminal_and_keeps_json_clean():
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal has a width
    proc = subprocess.Popen([*STEPSERVE, "bench", "throughput", *SMALL, "--num-prompts", "2000", "--input-len", "8",
                             "--output-len", "4", "--json"], stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)
    seen: list[bytes] = []

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the process closed its end
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    stdout, _ = proc.communicate(timeout=300)
    reader.join(timeout=10)
    os.close(controller)
    terminal_text = b"".join(seen).decode(errors="replace")
    assert proc.returncode == 0, terminal_text[-3000:]
    assert "stepserve: micro-llama, float32 on cpu, eager step; ready in " in terminal_text
    assert "2000/2000" in terminal_text and "req/s" in terminal_text  # tqdm's bar: done / total, rate
    lines = stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("Throughput: "), stdout
    assert json.loads(lines[1])["num_prompts"] == 2000


def test_generate_says_what_it_runs_on_stderr_only():
    out = subprocess.run([*STEPSERVE, "generate", *SMALL, "--max-tokens", "3", "--ignore-eos", "hello"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "stepserve: micro-llama, float32 on cpu, eager step; ready in " in out.stderr
    assert "stepserve:" not in out.stdout and "\r" not in out.stderr  # no bar off a terminal
