"""Models named by their Hugging Face hub id, as a user names them: `LLM(model="ORG/NAME")`,
`stepserve serve --model ORG/NAME`. No network here: a hub cache made on disk, laid out as
huggingface_hub's downloads leave it, read with HF_HUB_OFFLINE=1 and HF_HUB_CACHE set for the
whole command (huggingface_hub reads them once, when imported, so each test runs its own
Python); and, for what a download fetches, a hub on loopback (tests/fake_hub.py). The model is
sharded there; the folder it is compared with is not."""
import json
import os
import shutil
import subprocess
import sys

import openai
import pytest

from tests.cli_helpers import STEPSERVE, until_ctrl_c
from tests.e2e_helpers import free_port
from tests.fake_hub import COMMIT, FakeHub
from tests.hf_hub_cache import add_to_hub_cache
from tests.hf_model_folders import make_llama_folder, resharded

HUB_ID = "test-org/tiny-model"
EAGER = ["--dtype", "float32", "--kv-cache-gb", "0.05", "--enforce-eager", "--data-parallel-size", "1"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> dict:
    """The folder, and the environment in which HUB_ID is its sharded copy, cached offline."""
    root = tmp_path_factory.mktemp("hub")
    folder = make_llama_folder(str(root / "llama"))
    sharded = resharded(folder, str(root / "sharded"), max_shard_size="100KB")
    add_to_hub_cache(str(root / "cache"), HUB_ID, sharded)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(root / "cache"), "HF_HOME": str(root / "home")}
    return {"folder": folder, "sharded": sharded, "env": env, "cache": str(root / "cache")}


def _python(code: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)


_GREEDY_BY_LLM = """
import json, sys
from stepserve import LLM, SamplingParams
params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
out = {}
for model in sys.argv[1:]:
    with LLM(model=model, dtype="float32", kv_cache_gb=0.05, enforce_eager=True, data_parallel_size=1) as llm:
        outputs = llm.generate(["hello", [5, 6, 7, 8]], params, use_tqdm=False)
        out[model] = {"name": llm.client.model_info().model, "token_ids": [o.outputs[0].token_ids for o in outputs]}
print(json.dumps(out))
"""


def test_llm_generates_from_a_hub_id_as_from_its_folder(hub):
    out = _python(_GREEDY_BY_LLM, hub["env"], HUB_ID, hub["folder"])
    assert out.returncode == 0, out.stderr[-3000:]
    by_model = json.loads(out.stdout.strip().splitlines()[-1])
    by_id, by_folder = by_model[HUB_ID], by_model[hub["folder"]]
    assert by_id["name"] == HUB_ID  # what the worker reports, and the gateway serves it as
    assert [len(ids) for ids in by_id["token_ids"]] == [8, 8]
    assert by_id["token_ids"] == by_folder["token_ids"]


def test_serve_answers_openai_for_a_hub_id(hub, monkeypatch):
    for name in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.setenv(name, hub["env"][name])
    port = free_port()
    with until_ctrl_c("serve", "--model", HUB_ID, *EAGER, "--port", str(port)) as line:
        assert f"{HUB_ID} on 1 replica(s)" in line
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused") as api:
            assert [m.id for m in api.models.list()] == [HUB_ID]
            out = api.completions.create(model=HUB_ID, prompt="hello", max_tokens=3, extra_body={"ignore_eos": True})
            assert out.usage.completion_tokens == 3


NOT_CACHED = "no-org/no-model"
# What the user is told: the id, that it is not cached, and why nothing was downloaded.
NOT_CACHED_REASON = (f"cannot load model '{NOT_CACHED}': no such folder, and not in the Hugging Face cache "
                     "({cache}); HF_HUB_OFFLINE=1 forbids downloading it")


@pytest.mark.parametrize("command", [["generate", "hello"], ["serve", "--port", "0"], ["up"]])
def test_a_command_given_an_id_not_in_the_cache_exits_with_one_line(hub, command):
    out = subprocess.run([*STEPSERVE, *command, "--model", NOT_CACHED, *EAGER], capture_output=True, text=True,
                         env=hub["env"], timeout=120)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepserve: " + NOT_CACHED_REASON.format(cache=hub["cache"])), \
        out.stderr
    assert out.stdout == ""


def test_a_worker_started_alone_given_an_id_not_in_the_cache_exits_with_one_line(hub, tmp_path):
    empty = str(tmp_path / "empty-cache")
    out = subprocess.run([sys.executable, "-m", "worker_svc", "--scheduler", f"tcp://127.0.0.1:{free_port()}",
                          "--model", NOT_CACHED, "--download-dir", empty], capture_output=True, text=True,
                         env=hub["env"], timeout=120)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(NOT_CACHED_REASON.format(cache=empty)), out.stderr


def test_llm_given_an_id_not_in_the_cache_raises_that_line(hub):
    out = _python("from stepserve import LLM\n"
                  "try:\n"
                  f"    LLM(model={NOT_CACHED!r})\n"
                  "except RuntimeError as e:\n"
                  "    print(e)\n", hub["env"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(NOT_CACHED_REASON.format(cache=hub["cache"])) and out.stdout.count("\n") == 1


def test_a_hub_id_downloads_only_the_files_the_worker_reads(hub, tmp_path):
    repo = tmp_path / "repo"  # the sharded model, and files a repository may hold besides
    shutil.copytree(hub["sharded"], repo)
    for name in ("consolidated.safetensors", "pytorch_model.bin", "model.onnx", "README.md"):
        (repo / name).write_bytes(b"not read by the worker")
    wanted = sorted(set(os.listdir(hub["sharded"])))
    assert "model.safetensors.index.json" in wanted and "tokenizer.json" in wanted
    cache = tmp_path / "downloads"
    with FakeHub(HUB_ID, str(repo)) as fake:
        env = {**hub["env"], "HF_ENDPOINT": fake.url}
        del env["HF_HUB_OFFLINE"]
        command = [*STEPSERVE, "generate", "--model", HUB_ID, "--download-dir", str(cache), *EAGER, "hello"]
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0 and out.stdout.strip(), out.stderr[-3000:]
        # Each once: the launcher fetched them, its worker found them in the cache.
        assert sorted(fake.downloaded) == wanted
        assert sorted(os.listdir(cache / "models--test-org--tiny-model" / "snapshots" / COMMIT)) == wanted
        out = subprocess.run([*command, "--revision", "v9"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip() == ("stepserve: cannot load model 'test-org/tiny-model': the Hugging Face Hub has no "
                                  "revision 'v9' of it")
