"""compose.yaml, without a docker engine: each service's command runs as a local process, service
names resolved to 127.0.0.1, and the pair serves a request."""
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

from client_sdk import Client, SamplingParams

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def compose():
    with open(os.path.join(ROOT, "compose.yaml")) as f:
        return yaml.safe_load(f)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_command(command: list[str], ports: dict[int, int], env: dict[str, str]) -> list[str]:
    """The service's command as this machine runs it: variables expanded, hosts on loopback."""
    def expand(arg: str) -> str:
        arg = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), arg)
        arg = re.sub(r"tcp://(0\.0\.0\.0|scheduler):(\d+)", lambda m: f"tcp://127.0.0.1:{ports[int(m.group(2))]}", arg)
        return arg
    args = [expand(a) for a in command]
    assert args[0] == "python"
    return [sys.executable, *args[1:]]


def test_only_the_frontend_is_published_and_gpu_profile_reserves_nvidia(compose):
    services = compose["services"]
    assert services["scheduler"]["ports"] == ["5555:5555"]
    assert "ports" not in services["worker"]
    assert "profiles" not in services["worker"]
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        check = subprocess.run(["docker", "compose", "-f", os.path.join(ROOT, "compose.yaml"), "config", "-q"],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_compose_services_serve_a_request(compose):
    ports = {5555: free_port(), 5556: free_port()}
    env = {"STEPSERVE_MODEL": "micro-llama", "STEPSERVE_KV_CACHE_GB": "0.05"}
    procs = []
    try:
        for name in ("scheduler", "worker"):  # the default profile, in depends_on order
            command = local_command(compose["services"][name]["command"], ports, env)
            procs.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(f"tcp://127.0.0.1:{ports[5555]}", timeout_s=60) as client:
            client.wait_for_workers(1, timeout_s=120)
            out = client.generate("hello", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
            assert out.finish_reason == "length" and len(out.token_ids) == 4
            assert client.model_info().model == "micro-llama"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
