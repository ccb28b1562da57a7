"""The Ray Data processor (stepserve/ray_data.py) on a local Ray of 2 CPUs: 10,000
rows through 2 actors once each, equal to the SDK's greedy outputs; rows of every kind and one
that fails alone; replica actors (each its own scheduler and worker), one killed mid-job; an
embedding model's `embedding` column."""
import os
import signal
import time

import pytest

from tests.e2e_helpers import RAY_MISSING

pytest.importorskip("ray.data", reason=RAY_MISSING)
import ray  # noqa: E402

from stepserve import LLM, SamplingParams  # noqa: E402
from stepserve.ray_data import ProcessorConfig, build_processor  # noqa: E402
from tests.cli_helpers import pids  # noqa: E402
from tests.hf_model_folders import make_bert_folder  # noqa: E402

ENGINE = {"enforce_eager": True, "dtype": "float32", "kv_cache_gb": 0.05}
DISTINCT = 200  # distinct prompts among the rows: the SDK reference runs each once


def _prompt(i: int) -> list[int]:
    j = i % DISTINCT
    return [1, 5 + j, 7 + (j * 7) % 13]


@pytest.fixture(scope="module")
def llm(ray_local, chat_folder):
    with LLM(chat_folder, **ENGINE) as llm:
        yield llm


def _sdk_outputs(llm, max_tokens: int) -> list[list[int]]:
    """The SDK's greedy tokens for each distinct prompt."""
    reference = llm.generate([_prompt(i) for i in range(DISTINCT)],
                             SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in reference]


def test_ten_thousand_rows_through_two_actors_once_each_equal_to_the_sdk(llm):
    # The actors connect to the LLM's service (address=): the replica actors are the last test's.
    rows = [{"id": i, "prompt_token_ids": _prompt(i)} for i in range(10_000)]
    config = ProcessorConfig(address=llm.cluster.address, concurrency=2, batch_size=2_000,
                             sampling_params={"max_tokens": 2, "temperature": 0.0, "ignore_eos": True})
    started = time.monotonic()
    out = build_processor(config, postprocess=lambda row: {"id": row["id"], "ids": row["generated_token_ids"],
                                                           "error": row["error"]})(ray.data.from_items(rows)).take_all()
    print(f"10,000 rows through 2 actors in {time.monotonic() - started:.1f} s")
    assert sorted(r["id"] for r in out) == list(range(10_000))
    assert all(r["error"] is None for r in out)
    expected = _sdk_outputs(llm, max_tokens=2)
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


def test_replica_actors_one_killed_mid_job_and_every_row_comes_back_once(llm, chat_folder, tmp_path):
    folder = str(tmp_path / "model-of-this-test")  # names this test's workers among the processes
    os.symlink(chat_folder, folder)
    rows = [{"id": i, "prompt_token_ids": _prompt(i)} for i in range(2_000)]
    config = ProcessorConfig(model=folder, concurrency=2, batch_size=100, engine_kwargs=ENGINE,
                             sampling_params={"max_tokens": 4, "temperature": 0.0, "ignore_eos": True})
    seen, killed = {}, None
    for row in build_processor(config)(ray.data.from_items(rows)).iter_rows():
        assert row["id"] not in seen and row["error"] is None
        seen[row["id"]] = list(row["generated_token_ids"])
        if killed is None:  # an actor's process, with its scheduler and worker, once rows come out
            killed = _parent_of(int(pids(f"worker_svc.*{folder}")[0]))
            os.kill(killed, signal.SIGKILL)
    assert killed is not None and sorted(seen) == list(range(2_000))
    expected = _sdk_outputs(llm, max_tokens=4)
    assert all(ids == expected[i % DISTINCT] for i, ids in seen.items())


def test_an_embedding_model_gives_an_embedding_column(ray_local, tmp_path):
    texts = [f"row {i} of a corpus" for i in range(40)]
    with LLM(make_bert_folder(str(tmp_path / "bert")), task="embed", **ENGINE) as embedder:
        rows = [{"id": i, "prompt": text} for i, text in enumerate(texts)] + [{"id": 40, "prompt": None}]
        config = ProcessorConfig(address=embedder.cluster.address, batch_size=16)
        out = {r["id"]: r for r in build_processor(config)(ray.data.from_items(rows)).take_all()}
        expected = embedder.embed(texts, use_tqdm=False)
    assert sorted(out) == list(range(41)) and "needs 'prompt'" in out[40]["error"] and out[40]["embedding"] is None
    for i, output in enumerate(expected):
        assert out[i]["error"] is None and out[i]["num_input_tokens"] == len(output.prompt_token_ids)
        assert list(out[i]["embedding"]) == pytest.approx(output.outputs.embedding, abs=1e-6)


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
