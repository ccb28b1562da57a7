"""compose.yaml, without a docker engine: each service's command runs as a local process, service
names resolved to 127.0.0.1; they serve a request over ZeroMQ and over HTTP, and every
healthcheck passes, both ways: open, and CurveZMQ (STEPSERVE_CURVE_KEYS, the keys folder each
service takes its own key pair from). The worker runs eagerly here (--enforce-eager added to its
command: the compiled step, ~9 s more to start, is tested elsewhere). benchmarks/docker_proof.py
runs the same file on a real engine."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from client_sdk import AuthenticationError, Client, SamplingParams
from protocol.curve import generate_keys
from tests.e2e_helpers import free_port
from tests.gateway_helpers import post_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def compose():
    with open(os.path.join(ROOT, "compose.yaml")) as f:
        return yaml.safe_load(f)


def local_command(command: list[str], ports: dict[int, int], env: dict[str, str]) -> list[str]:
    """The service's command (or healthcheck) as this machine runs it: variables expanded,
    hosts on loopback, the compose ports mapped to free ones."""
    def expand(arg: str, previous: str) -> str:
        arg = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), arg)
        arg = re.sub(r"(tcp|http)://(0\.0\.0\.0|127\.0\.0\.1|scheduler):(\d+)",
                     lambda m: f"{m.group(1)}://127.0.0.1:{ports[int(m.group(3))]}", arg)
        return str(ports[int(arg)]) if previous == "--port" else arg
    args = [expand(a, p) for a, p in zip(command, ["", *command])]
    if args[0] == "CMD":  # a healthcheck's exec form
        args = args[1:]
    program = {"python": [sys.executable], "stepserve": [sys.executable, "-m", "stepserve.cli"]}[args[0]]
    return [*program, *args[1:]]


def test_only_the_frontend_and_gateway_are_published_and_gpu_profile_reserves_nvidia(compose):
    services = compose["services"]
    # Published on the host's loopback unless STEPSERVE_PUBLISH_ADDRESS says otherwise.
    assert services["scheduler"]["ports"] == ["${STEPSERVE_PUBLISH_ADDRESS:-127.0.0.1}:5555:5555"]
    assert services["gateway"]["ports"] == ["${STEPSERVE_PUBLISH_ADDRESS:-127.0.0.1}:8000:8000"]
    for name in ("scheduler", "worker", "worker-gpu", "gateway"):
        assert services[name]["environment"]["STEPSERVE_CURVE_KEYS"] == "${STEPSERVE_CURVE_KEYS:-}"
        assert services[name]["volumes"][0] == "${STEPSERVE_KEYS_DIR:-./keys}:/keys:ro"
        assert services[name]["stop_grace_period"] == "40s"  # longer than the 30 s drain
    assert services["gateway"]["volumes"][1] == "batches:/data/batches" and "batches" in compose["volumes"]
    assert "--batch-dir" in services["gateway"]["command"]
    scheduler = services["scheduler"]["command"]  # batch work yields to interactive work
    assert scheduler[scheduler.index("--scheduling-policy") + 1] == "priority"
    assert "ports" not in services["worker"]
    assert all("healthcheck" in services[name] for name in ("scheduler", "worker", "worker-gpu", "gateway"))
    assert "profiles" not in services["worker"]
    gpu = services["worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        check = subprocess.run(["docker", "compose", "-f", os.path.join(ROOT, "compose.yaml"), "config", "-q"],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def healthy(compose, name: str, ports, env, proc_env=None) -> bool:
    test = compose["services"][name]["healthcheck"]["test"]
    return subprocess.run(local_command(test, ports, env), cwd=ROOT, capture_output=True, timeout=60,
                          env=proc_env).returncode == 0


@pytest.mark.parametrize("way", ["open", "curve"])
def test_compose_services_serve_a_request(compose, way, tmp_path):
    ports = {5555: free_port(), 5556: free_port(), 8000: free_port()}
    env = {"STEPSERVE_MODEL": "micro-llama", "STEPSERVE_KV_CACHE_GB": "0.05"}
    proc_env, client_keys = dict(os.environ), {}
    if way == "curve":  # as `stepserve keys generate ./keys` + STEPSERVE_CURVE_KEYS=/keys, /keys mounted
        keys = str(tmp_path / "keys")
        generate_keys(keys)
        proc_env["STEPSERVE_CURVE_KEYS"] = keys
        client_keys = {"curve_server_key": f"{keys}/scheduler.key", "curve_secret_key": f"{keys}/client.key_secret"}
    procs = []
    try:
        for name in ("scheduler", "gateway", "worker"):  # the default profile, in depends_on order
            if name == "worker":
                assert not healthy(compose, "worker", ports, env, proc_env)  # none has joined yet
            command = local_command(compose["services"][name]["command"], ports, env)
            if name == "worker":
                command.append("--enforce-eager")
            procs.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          env=proc_env))
        if way == "curve":
            with Client(f"tcp://127.0.0.1:{ports[5555]}") as stranger, pytest.raises(AuthenticationError):
                stranger.health()  # no keys: refused
        with Client(f"tcp://127.0.0.1:{ports[5555]}", timeout_s=60, **client_keys) as client:
            client.wait_for_workers(1, timeout_s=120)
            out = client.generate("hello", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)).outputs[0]
            assert out.finish_reason == "length" and len(out.token_ids) == 4
            assert client.model_info().model == "micro-llama"
        deadline = time.monotonic() + 60  # the gateway may still be starting
        while not healthy(compose, "gateway", ports, env, proc_env):
            assert time.monotonic() < deadline, "the gateway never became healthy"
            time.sleep(0.1)
        assert healthy(compose, "scheduler", ports, env, proc_env) and healthy(compose, "worker", ports, env, proc_env)
        status, body = post_json(f"http://127.0.0.1:{ports[8000]}/v1/completions",
                                 {"prompt": "hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
