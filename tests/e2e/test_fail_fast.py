"""A worker that cannot load fails every command and API that started it, within seconds, with
the worker's own error message (not only "see the log") and exit status 1, no traceback from
the command itself. Real processes, a real model folder whose architecture nobody serves."""
import json
import subprocess
import time

import pytest

from stepserve import LLM
from stepserve.launcher import LocalCluster, ProcessExited
from tests.cli_helpers import STEPSERVE
from tests.hf_model_folders import make_llama_folder

REASON = "unsupported architectures ['NoSuchArchitectureForCausalLM']"
ANY_PORT = "tcp://127.0.0.1:*"
COMMANDS = {
    "generate": ["generate", "hello"],
    "up": ["up", "--frontend", ANY_PORT, "--worker-address", ANY_PORT],
    "serve": ["serve", "--port", "0"],
    "bench throughput": ["bench", "throughput", "--num-prompts", "10", "--json"],
}


@pytest.fixture(scope="module")
def unsupported_folder(tmp_path_factory) -> str:
    folder = make_llama_folder(str(tmp_path_factory.mktemp("models") / "unsupported"))
    with open(f"{folder}/config.json") as f:
        config = json.load(f)
    config["architectures"] = ["NoSuchArchitectureForCausalLM"]
    with open(f"{folder}/config.json", "w") as f:
        json.dump(config, f)
    return folder


@pytest.mark.parametrize("command", list(COMMANDS))
def test_command_exits_with_the_workers_reason(command, unsupported_folder):
    start = time.monotonic()
    out = subprocess.run([*STEPSERVE, *COMMANDS[command], "--model", unsupported_folder, "--enforce-eager"],
                         capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert out.returncode == 1, out.stderr
    assert elapsed < 30, f"{command} took {elapsed:.0f} s to fail"
    last_line = out.stderr.strip().splitlines()[-1]
    assert last_line.startswith("stepserve: a worker exited with code 1: ") and REASON in last_line, \
        out.stderr[-3000:]
    assert out.stdout == ""  # nothing half-done on stdout (`--json` readers see no output, not junk)


def test_llm_and_local_cluster_raise_the_workers_reason(unsupported_folder):
    for start in (lambda: LLM(unsupported_folder, enforce_eager=True),
                  lambda: LocalCluster(unsupported_folder, 2, worker_args=["--enforce-eager"]).start()):
        began = time.monotonic()
        with pytest.raises(ProcessExited) as err:
            start()
        assert time.monotonic() - began < 30
        assert REASON in str(err.value) and err.value.returncode == 1
        assert REASON in err.value.log  # the worker's own log: its one line, no traceback to bury it
