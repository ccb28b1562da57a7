"""The HTTP gateway end to end: real scheduler, worker and gateway processes on loopback, driven
with the real `openai` package and with curl. Three gateways share one scheduler."""
import asyncio
import http.client
import json
import time
from urllib.parse import urlparse

import openai
import pytest

from stepserve.launcher import LocalCluster
from tests.e2e_helpers import TEST_WORKER_ARGS, hf_greedy
from tests.gateway_helpers import curl, metric_samples, post_json, sse_events, start_gateways

KEY = "sk-test-key"
MODEL = "tiny-chat"
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
PROMPTS = [[4 + (7 * i + j) % 990 for j in range(8)] for i in range(200)]  # distinct, equal lengths
NUM_NEW = 5


@pytest.fixture(scope="module")
def cluster(chat_folder):
    with LocalCluster(chat_folder, 1, worker_args=TEST_WORKER_ARGS, scheduler_args=["--metrics-port", "0"]) as c:
        _, c.keyed_url, c.small_url = start_gateways(c, ["--served-model-name", MODEL], ["--api-key", KEY],
                                                      ["--max-num-requests", "1"])
        yield c


@pytest.fixture(scope="module")
def reference(chat_folder):
    """Transformers' greedy continuations of PROMPTS."""
    return hf_greedy(chat_folder, PROMPTS, NUM_NEW)


@pytest.fixture(scope="module")
def api(cluster):
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0)


def scheduler_metrics(cluster) -> dict:
    return metric_samples(curl(cluster.metrics_url + "/metrics")[1])


def test_greedy_token_ids_match_transformers(api, reference):
    r = api.completions.create(model=MODEL, prompt=PROMPTS[:3], max_tokens=NUM_NEW, temperature=0.0,
                               extra_body={"ignore_eos": True, "return_token_ids": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.token_ids for c in r.choices] == reference[:3]
    assert [c.prompt_token_ids for c in r.choices] == PROMPTS[:3]
    assert [c.finish_reason for c in r.choices] == ["length"] * 3
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (24, 3 * NUM_NEW)
    assert r.model == MODEL and r.object == "text_completion"


def test_stream_concatenates_to_the_whole_completion(api):
    whole = api.completions.create(model=MODEL, prompt="hello world", max_tokens=12, **GREEDY)
    chunks = list(api.completions.create(model=MODEL, prompt="hello world", max_tokens=12, stream=True,
                                         stream_options={"include_usage": True}, **GREEDY))
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in text_chunks][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1]) and len(text_chunks) > 2
    assert chunks[-1].usage.completion_tokens == 12 == whole.usage.completion_tokens


def test_n_choices_are_seeded_and_distinct(api):
    def ask():
        return api.completions.create(model=MODEL, prompt=["once", "upon"], n=2, max_tokens=8, temperature=1.0,
                                      seed=7, extra_body={"ignore_eos": True, "return_token_ids": True})
    first, again = ask(), ask()
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    ids = [c.token_ids for c in first.choices]
    assert ids[0] != ids[1] and ids[2] != ids[3]  # n choices of one prompt differ
    assert ids == [c.token_ids for c in again.choices]  # and the seed reproduces them
    assert first.usage.completion_tokens == 32


def test_stop_strings_cut_the_output_and_abort_the_request(api, cluster):
    text = api.completions.create(model=MODEL, prompt="stop here", max_tokens=40, **GREEDY).choices[0].text
    stop = text[12:15]
    cut = text.find(stop)
    aborts_before = scheduler_metrics(cluster).get(("stepserve:request_success_total", (("finished_reason", "abort"),)), 0)
    # max_tokens far past the match: the abort reaches the scheduler long before the length limit.
    r = api.completions.create(model=MODEL, prompt="stop here", max_tokens=200, stop=[stop, "never-seen"], **GREEDY)
    choice = r.choices[0]
    assert (choice.text, choice.finish_reason, choice.stop_reason) == (text[:cut], "stop", stop)
    assert r.usage.completion_tokens < 40
    streamed = api.completions.create(model=MODEL, prompt="stop here", max_tokens=200, stop=stop, stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed) == text[:cut]
    kept = api.completions.create(model=MODEL, prompt="stop here", max_tokens=200, stop=stop,
                                  extra_body={"ignore_eos": True, "include_stop_str_in_output": True}, temperature=0)
    assert kept.choices[0].text == text[:cut + len(stop)]
    # The scheduler stopped each of the three at the match (an abort there), not at max_tokens.
    aborts = scheduler_metrics(cluster)[("stepserve:request_success_total", (("finished_reason", "abort"),))]
    assert aborts - aborts_before == 3


def test_curl_gets_server_sent_events_that_end_with_done(cluster):
    status, body = post_json(cluster.base_url + "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
                              "stream_options": {"include_usage": True}, "ignore_eos": True})
    events = sse_events(body)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert {(c["object"], c["id"]) for c in chunks} == {("chat.completion.chunk", chunks[0]["id"])}
    status, body = post_json(cluster.base_url + "/v1/completions", {"prompt": [5, 6], "max_tokens": 3})
    assert status == 200 and json.loads(body)["choices"][0]["text"] is not None


def test_completion_logprobs(api):
    r = api.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, logprobs=2, **GREEDY)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(6)]
    for sampled, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3 and max(top.values()) == pytest.approx(sampled)  # greedy: the best


def test_chat_renders_the_template_like_transformers(api, chat_folder):
    from transformers import AutoTokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "How?"}]
    expected_prompt = AutoTokenizer.from_pretrained(chat_folder).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    r = api.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=NUM_NEW, temperature=0.0,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.prompt_token_ids == list(expected_prompt)
    assert r.choices[0].token_ids == hf_greedy(chat_folder, [list(expected_prompt)], NUM_NEW)[0]
    assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
    chunks = list(api.chat.completions.create(model=MODEL, messages=messages, max_tokens=NUM_NEW, stream=True,
                                              **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_logprobs_and_n(api):
    r = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2,
                                    seed=3, logprobs=True, top_logprobs=2, temperature=0.8)
    assert [c.index for c in r.choices] == [0, 1]
    for choice in r.choices:
        content = choice.logprobs.content
        assert len(content) == 4 and all(len(e.top_logprobs) == 2 for e in content)
        assert all(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in content)
        assert all(e.bytes == list(e.token.encode()) for e in content)
    assert r.usage.completion_tokens == 8


def test_penalties_and_bias_with_openai_names(api):
    """OpenAI's logit_bias and penalties, vLLM's extras in extra_body; the exact outputs are
    test_penalties.py's (against a reference over transformers' logits)."""
    biased = api.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, logit_bias={"77": 100},
                                    extra_body={"return_token_ids": True, "ignore_eos": True}, temperature=0.0)
    assert biased.choices[0].token_ids == [77] * 4
    penalised = api.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, logit_bias={"77": 6, "78": 4},
                                       presence_penalty=2.0, frequency_penalty=2.0, temperature=0.0,
                                       extra_body={"return_token_ids": True, "ignore_eos": True,
                                                   "repetition_penalty": 1.2, "allowed_token_ids": [77, 78]})
    assert penalised.choices[0].token_ids[:2] == [77, 78]  # 77 once is 6 - 2 - 2 < 4: 78


def test_structured_outputs_with_openai_and_vllm_fields(api, cluster):
    """response_format (chat and completions) and vLLM's structured_outputs; the many-request
    proof is test_structured_outputs.py's."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    chat = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=60,
                                       temperature=0.0, response_format={"type": "json_schema", "json_schema": {
                                           "name": "thing", "schema": schema, "strict": True}})
    assert set(json.loads(chat.choices[0].message.content)) == {"n", "ok"}
    assert chat.choices[0].finish_reason == "stop"
    obj = api.completions.create(model=MODEL, prompt="x", max_tokens=120, temperature=0.0, seed=1,
                                 extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(obj.choices[0].text), dict)
    choice = api.completions.create(model=MODEL, prompt="x", max_tokens=10, temperature=1.0, n=3, seed=2,
                                    extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert all(c.text in ("yes", "no") for c in choice.choices)
    url = cluster.base_url + "/v1/completions"
    for structured, reason in (({"structured_outputs": {"regex": "(unclosed"}}, "regex does not compile"),
                               ({"structured_outputs": {"choice": []}}, "choice must not be empty"),
                               ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
                                "not both"),
                               ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                                "json_schema.schema")):
        status, text = post_json(url, {"prompt": "x", "max_tokens": 5, **structured})
        error = json.loads(text)["error"]
        assert (status, error["code"]) == (400, "invalid_params") and reason in error["message"], text
    assert api.completions.create(model=MODEL, prompt="still serving", max_tokens=2).choices


def test_echo_with_logprobs_scores_the_prompt_in_openai_shape(api, chat_folder):
    """lm-evaluation-harness's scoring call: echo, logprobs, max_tokens 0; equal to log_softmax of
    transformers' logits on the prompt."""
    import torch
    from transformers import AutoModelForCausalLM
    prompt = PROMPTS[5]
    r = api.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=2, temperature=0.0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(prompt) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert r.choices[0].text == "".join(lp.tokens) and lp.text_offset[1] == len(lp.tokens[0])
    assert r.usage.completion_tokens == 0 and r.choices[0].finish_reason == "length"
    model = AutoModelForCausalLM.from_pretrained(chat_folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    for position in range(1, len(prompt)):
        assert abs(lp.token_logprobs[position] - expected[position - 1, prompt[position]].item()) < 1e-4
        assert len(lp.top_logprobs[position]) in (2, 3)  # the top 2, and the prompt's token if not among them
    generated = api.completions.create(model=MODEL, prompt="hello", max_tokens=3, echo=True, logprobs=1, **GREEDY)
    choice = generated.choices[0]
    assert choice.text.startswith("hello") and len(choice.logprobs.tokens) == 5 + 3
    assert choice.logprobs.token_logprobs[0] is None and None not in choice.logprobs.token_logprobs[1:]
    assert choice.logprobs.text_offset == sorted(choice.logprobs.text_offset)
    status, text = post_json(api.base_url.__str__() + "completions", {"prompt": "x", "max_tokens": 0})
    assert status == 400 and "echo" in text


def test_models_and_health(api, cluster):
    assert [m.id for m in api.models.list().data] == [MODEL]
    status, body = curl(cluster.base_url + "/health")
    assert status == 200 and json.loads(body)["num_workers"] == 1


def test_errors_have_openai_shape(api, cluster):
    url = cluster.base_url + "/v1/completions"
    for body, code in (({"prompt": "x", "temperature": -1}, "invalid_params"),
                       ({"prompt": "x", "max_tokens": 1000}, "prompt_too_long"),
                       ({"prompt": [4] * 300}, "prompt_too_long"),
                       ({"prompt": [5, 100000]}, "invalid_params"),
                       ({"prompt": "x", "presence_penalty": 2.5}, "invalid_params"),
                       ({"prompt": "x", "logit_bias": {"5": 101}}, "invalid_params"),
                       ({"prompt": "x", "logit_bias": {"five": 1}}, "invalid_params"),
                       ({"prompt": "x", "logit_bias": {"100000": 1}}, "invalid_params"),
                       ({"prompt": "x", "echo": True, "max_tokens": 0, "logprobs": 21}, "invalid_params"),
                       ({"prompt": []}, "invalid_params"),
                       ({"prompt": "x", "model": "no-such-model"}, "model_not_found")):
        status, text = post_json(url, body)
        error = json.loads(text)["error"]
        assert (status, error["code"]) == (404 if code == "model_not_found" else 400, code), text
        assert error["message"] and error["type"]
    assert curl(url, "-d", "{not json")[0] == 400
    assert curl(cluster.base_url + "/v1/nowhere")[0] == 404
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="other", prompt="x")
    with pytest.raises(openai.BadRequestError):
        api.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}])  # the template refuses
    assert api.completions.create(model=MODEL, prompt="still serving", max_tokens=2).choices  # and it serves on


def test_api_key(cluster):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=cluster.keyed_url + "/v1", api_key="wrong", max_retries=0).models.list()
    status, body = post_json(cluster.keyed_url + "/v1/completions", {"prompt": "x"})
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    keyed = openai.OpenAI(base_url=cluster.keyed_url + "/v1", api_key=KEY, max_retries=0)
    assert keyed.completions.create(model=keyed.models.list().data[0].id, prompt="x", max_tokens=2).choices
    assert curl(cluster.keyed_url + "/health")[0] == 200 and curl(cluster.keyed_url + "/metrics")[0] == 200


def _open_stream(base_url: str, body: dict) -> http.client.HTTPConnection:
    """A streaming completion whose first event has arrived; the caller closes the connection."""
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    conn.response = response
    return conn


def test_overloaded_gateway_answers_503_at_once(cluster):
    conn = _open_stream(cluster.small_url, {"prompt": [5, 6], "max_tokens": 250, "ignore_eos": True})
    try:
        started = time.monotonic()
        status, body = post_json(cluster.small_url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 503 and json.loads(body)["error"]["code"] == "overloaded"
        assert time.monotonic() - started < 5
    finally:
        conn.close()
    deadline = time.monotonic() + 30  # the closed stream's slot comes back
    while post_json(cluster.small_url + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_client_that_disconnects_aborts_its_request(cluster):
    abort_key = ("stepserve:request_success_total", (("finished_reason", "abort"),))
    before = scheduler_metrics(cluster).get(abort_key, 0)
    conn = _open_stream(cluster.base_url, {"prompt": [7, 8, 9], "max_tokens": 250, "ignore_eos": True})
    conn.response.readline()
    conn.close()
    deadline = time.monotonic() + 30
    while scheduler_metrics(cluster).get(abort_key, 0) == before:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.05)
    samples = scheduler_metrics(cluster)
    assert samples[abort_key] == before + 1 and samples[("stepserve:num_requests_running", ())] == 0
    # Not streamed: the client gives up waiting for the whole body.
    url = urlparse(cluster.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": [7, 8], "max_tokens": 250, "ignore_eos": True}),
                 {"Content-Type": "application/json"})
    while scheduler_metrics(cluster)[("stepserve:num_requests_running", ())] == 0:
        assert time.monotonic() < deadline, "the request never ran"
    conn.close()
    while scheduler_metrics(cluster)[abort_key] == before + 1:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.05)
    assert scheduler_metrics(cluster)[abort_key] == before + 2


async def test_200_concurrent_streams_complete_with_every_token_in_order(cluster, reference):
    client = openai.AsyncOpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0)

    async def stream(prompt):
        chunks = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=NUM_NEW, stream=True,
                                                 temperature=0.0,
                                                 extra_body={"ignore_eos": True, "return_token_ids": True})
        ids, reasons = [], []
        async for chunk in chunks:
            ids += chunk.choices[0].token_ids
            reasons.append(chunk.choices[0].finish_reason)
        return ids, reasons[-1]

    try:
        results = await asyncio.wait_for(asyncio.gather(*(stream(p) for p in PROMPTS)), 120)
    finally:
        await client.close()
    assert [ids for ids, _ in results] == reference
    assert {reason for _, reason in results} == {"length"}


def test_metrics_agree_with_what_was_served(cluster):
    """Counters of the keyed gateway (its own traffic only) and of the scheduler, before/after."""
    keyed = openai.OpenAI(base_url=cluster.keyed_url + "/v1", api_key=KEY, max_retries=0)
    gateway_before, scheduler_before = metric_samples(curl(cluster.keyed_url + "/metrics")[1]), scheduler_metrics(cluster)
    usages = [keyed.completions.create(model=keyed.models.list().data[0].id, prompt=PROMPTS[i], max_tokens=3 + i,
                                       **GREEDY).usage for i in range(4)]
    gateway, scheduler = metric_samples(curl(cluster.keyed_url + "/metrics")[1]), scheduler_metrics(cluster)
    served = {"stepserve:prompt_tokens_total": sum(u.prompt_tokens for u in usages),
              "stepserve:generation_tokens_total": sum(u.completion_tokens for u in usages),
              "stepserve:request_success_total": 4, "stepserve:e2e_request_latency_seconds_count": 4,
              "stepserve:time_to_first_token_seconds_count": 4,
              "stepserve:inter_token_latency_seconds_count": sum(u.completion_tokens - 1 for u in usages)}
    for after, before in ((gateway, gateway_before), (scheduler, scheduler_before)):
        for name, value in served.items():
            labels = (("finished_reason", "length"),) if name == "stepserve:request_success_total" else ()
            assert after[(name, labels)] - before.get((name, labels), 0) == value, name
        assert after[("stepserve:num_requests_running", ())] == 0
        assert 0 <= after[("stepserve:kv_cache_usage_perc", ())] <= 1
        assert ("stepserve:num_preemptions_total", ()) in after and ("stepserve:num_requests_waiting", ()) in after


def test_no_worker_gets_503_at_once_and_a_model_without_template_400(tmp_path):
    with LocalCluster("micro-llama", 0, worker_args=TEST_WORKER_ARGS) as bare:
        url = bare.start_gateway()
        assert curl(url + "/health")[0] == 503
        started = time.monotonic()
        status, body = post_json(url + "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})
        assert status == 503 and json.loads(body)["error"]["code"] == "no_worker"
        assert time.monotonic() - started < 5
        bare.add_worker()
        deadline = time.monotonic() + 120
        while curl(url + "/health")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status, body = post_json(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 400 and json.loads(body)["error"]["code"] == "no_chat_template"
        assert "chat template" in json.loads(body)["error"]["message"]
        status, body = post_json(url + "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
