"""The Ray Data processor (client_sdk/ray_data.py) on a simulated two-node Ray cluster: rows
through replica actors once each, equal to the SDK's greedy outputs, a row that fails alone, and
an actor killed mid-job."""
import os
import signal
import time

import pytest

pytest.importorskip("ray.data", reason="Ray Data is not installed: the Ray tests need the ray extra "
                                       "(pip install -e '.[ray]')")
import ray  # noqa: E402

from client_sdk import LLM, SamplingParams  # noqa: E402
from client_sdk.ray_data import ProcessorConfig, build_processor  # noqa: E402
from tests.cli_helpers import pids  # noqa: E402

ENGINE = {"enforce_eager": True, "dtype": "float32", "kv_cache_gb": 0.05}
DISTINCT = 200  # distinct prompts among the rows: the SDK reference runs each once


def _prompt(i: int) -> list[int]:
    j = i % DISTINCT
    return [1, 5 + j, 7 + (j * 7) % 13]


@pytest.fixture(scope="module")
def llm(ray_cluster, chat_folder):
    with LLM(chat_folder, **ENGINE) as llm:
        yield llm


def test_ten_thousand_rows_through_two_actors_once_each_equal_to_the_sdk(llm, chat_folder):
    rows = [{"id": i, "prompt_token_ids": _prompt(i)} for i in range(10_000)]
    config = ProcessorConfig(model=chat_folder, concurrency=2, batch_size=500, engine_kwargs=ENGINE,
                             sampling_params={"max_tokens": 2, "temperature": 0.0, "ignore_eos": True})
    started = time.monotonic()
    out = build_processor(config, postprocess=lambda row: {"id": row["id"], "ids": row["generated_token_ids"],
                                                           "error": row["error"]})(ray.data.from_items(rows)).take_all()
    print(f"10,000 rows through 2 actors in {time.monotonic() - started:.1f} s")
    assert sorted(r["id"] for r in out) == list(range(10_000))
    assert all(r["error"] is None for r in out)
    reference = llm.generate([_prompt(i) for i in range(DISTINCT)],
                             SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), use_tqdm=False)
    expected = [o.outputs[0].token_ids for o in reference]
    assert all(list(r["ids"]) == expected[r["id"] % DISTINCT] for r in out)


def test_rows_of_every_kind_and_a_row_that_fails_alone(llm):
    rows = [{"prompt": "hello there", "messages": None, "sampling_params": None},
            {"prompt": None, "messages": [{"role": "user", "content": "hi"}], "sampling_params": None},
            {"prompt": "x", "messages": None, "sampling_params": {"temperature": -1.0, "max_tokens": 3}},
            {"prompt": "y", "messages": None, "sampling_params": {"temperature": 0.0, "max_tokens": 5}},
            {"prompt": None, "messages": None, "sampling_params": None}]
    greedy = {"max_tokens": 2, "temperature": 0.0, "ignore_eos": True}
    config = ProcessorConfig(address=llm.cluster.address, sampling_params=greedy)
    out = build_processor(config)(ray.data.from_items(rows)).take_all()
    by_prompt = {(r["prompt"], r["messages"] is not None): r for r in out}
    text = by_prompt[("hello there", False)]
    sdk = llm.generate("hello there", SamplingParams(**greedy), use_tqdm=False)[0]
    assert (text["generated_text"], list(text["generated_token_ids"])) == (sdk.outputs[0].text, sdk.outputs[0].token_ids)
    assert text["num_input_tokens"] == sdk.num_prompt_tokens and text["num_generated_tokens"] == 2
    chat = by_prompt[(None, True)]
    sdk_chat = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(**greedy), use_tqdm=False)[0]
    assert list(chat["generated_token_ids"]) == sdk_chat.outputs[0].token_ids
    assert chat["num_input_tokens"] == sdk_chat.num_prompt_tokens and chat["error"] is None
    assert by_prompt[("y", False)]["num_generated_tokens"] == 5  # the row's own max_tokens
    bad = by_prompt[("x", False)]
    assert bad["finish_reason"] == "error" and "temperature" in bad["error"]
    assert "needs 'prompt'" in by_prompt[(None, False)]["error"]


def test_an_actor_killed_mid_job_and_every_row_comes_back_once(ray_cluster, chat_folder, tmp_path):
    folder = str(tmp_path / "model-of-this-test")  # names this test's workers among the processes
    os.symlink(chat_folder, folder)
    rows = [{"id": i, "prompt_token_ids": _prompt(i)} for i in range(3_000)]
    config = ProcessorConfig(model=folder, concurrency=2, batch_size=100, engine_kwargs=ENGINE,
                             sampling_params={"max_tokens": 8, "temperature": 0.0, "ignore_eos": True})
    seen, killed = [], None
    for row in build_processor(config)(ray.data.from_items(rows)).iter_rows():
        seen.append(row["id"])
        assert row["error"] is None
        if killed is None:
            actor_pid = _parent_of(int(pids(f"worker_svc.*{folder}")[0]))
            os.kill(actor_pid, signal.SIGKILL)
            killed = actor_pid
    assert killed is not None
    assert sorted(seen) == list(range(3_000))


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
