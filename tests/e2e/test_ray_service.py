"""`stepserve up --ray` and `serve --ray` on a simulated two-node Ray cluster: a replica on each
node serves the SDK and (with CurveZMQ keys on every link) the openai client, and a worker actor
SIGKILLed is restarted by Ray and serves again, nothing lost on the client's side."""
import os
import signal
import threading
import time

import pytest

from tests.e2e_helpers import RAY_MISSING, free_port

pytest.importorskip("ray", reason=RAY_MISSING)

from client_sdk import AuthenticationError, Client, SamplingParams  # noqa: E402
from tests.cli_helpers import pids, until_ctrl_c  # noqa: E402
from protocol.curve import generate_keys  # noqa: E402

FLAGS = ["--dtype", "float32", "--kv-cache-gb", "0.05", "--enforce-eager", "--data-parallel-size", "2",
         "--frontend", "tcp://127.0.0.1:*", "--worker-address", "tcp://127.0.0.1:*"]


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _workers(folder: str) -> list[int]:
    return [int(pid) for pid in pids(f"worker_svc.*{folder}")]


@pytest.fixture
def model(chat_folder, tmp_path) -> str:
    folder = str(tmp_path / "model-of-this-test")  # names this test's workers among the processes
    os.symlink(chat_folder, folder)
    return folder


def test_up_ray_serves_the_sdk_from_each_node_and_a_killed_worker_actor_serves_again(ray_cluster, model):
    with until_ctrl_c("up", "--ray", "--ray-address", ray_cluster.address, "--model", model, *FLAGS) as line:
        address = line.rsplit(" ", 1)[1].strip()
        workers = _workers(model)
        assert len(workers) == 2
        raylets = {_parent_of(_parent_of(pid)) for pid in workers}  # worker <- its actor <- its node's raylet
        assert len(raylets) == 2, "both replicas on one node"
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        prompts = [[1, 5 + i % 200, 9] for i in range(1_000)]
        with Client(address) as client:
            outputs = []
            batch = threading.Thread(target=lambda: outputs.extend(client.generate_batch(prompts, params)))
            batch.start()
            while client.health().num_running == 0:
                time.sleep(0.01)
            os.kill(_parent_of(workers[0]), signal.SIGKILL)  # the worker actor's process, mid-batch
            killed_at = time.monotonic()
            batch.join(timeout=120)
            assert len(outputs) == 1_000 and all(o.ok and len(o.outputs[0].token_ids) == 4 for o in outputs)
            while not (client.health().num_workers == 2 and workers[0] not in _workers(model)):
                assert time.monotonic() - killed_at < 30, "the killed worker actor did not come back in 30 s"
                time.sleep(0.1)
            print(f"the killed worker actor back in {time.monotonic() - killed_at:.1f} s")
            again = client.generate_batch(prompts, params)  # more than one replica's step holds
            assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outputs]
            assert all(r.num_steps > 0 for r in client.health().replicas), "the new worker served nothing"


def test_serve_ray_with_curve_keys_answers_the_openai_client(ray_cluster, model, tmp_path):
    import openai
    port = free_port()
    keys = str(tmp_path / "keys")
    generate_keys(keys)  # every link CurveZMQ: the actors get the files with their arguments
    with until_ctrl_c("serve", "--ray", "--ray-address", ray_cluster.address, "--model", model, *FLAGS,
                      "--curve-keys", keys, "--port", str(port), "--served-model-name", "small") as line:
        assert f"http://127.0.0.1:{port}/v1" in line
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        out = api.completions.create(model="small", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 3
        chat = api.chat.completions.create(model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat.usage.completion_tokens == 2
        sdk_address = line.rsplit("(SDK: ", 1)[1].split(")")[0]
        with Client(sdk_address, timeout_s=30) as keyless:  # the scheduler's socket is CurveZMQ indeed
            with pytest.raises(AuthenticationError):
                keyless.health()
        with Client(sdk_address, curve_server_key=f"{keys}/scheduler.key",
                    curve_secret_key=f"{keys}/client.key_secret") as client:
            assert client.health().num_workers == 2
