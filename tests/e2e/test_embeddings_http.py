"""The pooling endpoints over real HTTP on real clusters: /v1/embeddings through the `openai`
client (base64, its default, and float) equal sentence-transformers' encode; /v1/score,
/v1/rerank (and /rerank, /v2/rerank) equal transformers' cross-encoder; the wrong kind of model
gets a 400 both ways; bad input gets a 400 and the service keeps serving; run-batch and the
Batch API answer /v1/embeddings (and score, rerank) lines as the endpoints do."""
import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from openai import BadRequestError, OpenAI

from stepserve.launcher import LocalCluster
from tests.e2e_helpers import TEST_WORKER_ARGS
from tests.gateway_helpers import post_json, start_gateways
from tests.hf_model_folders import make_bert_folder, make_llama_folder, make_xlm_roberta_classifier_folder

TEXTS = ["the quick brown fox", "jumps over the lazy dog", "a", "embeddings for retrieval, scored and reranked " * 2]
QUERY = "which animal is quick?"
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return make_bert_folder(str(tmp_path_factory.mktemp("embed") / "bert"))  # mean pooling, normalised


@pytest.fixture(scope="module")
def reranker_folder(tmp_path_factory):
    return make_xlm_roberta_classifier_folder(str(tmp_path_factory.mktemp("rerank") / "reranker"))


@pytest.fixture(scope="module")
def embed_cluster(bert_folder):
    with LocalCluster(bert_folder, 1, worker_args=TEST_WORKER_ARGS) as running:
        yield running


@pytest.fixture(scope="module")
def embed_url(embed_cluster):
    return start_gateways(embed_cluster, [])[0]


@pytest.fixture(scope="module")
def rerank_url(reranker_folder):
    with LocalCluster(reranker_folder, 1, worker_args=TEST_WORKER_ARGS) as running:
        yield start_gateways(running, [])[0]


def openai_client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def st_embeddings(folder: str, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(folder, device="cpu").encode(texts, convert_to_numpy=True)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def hf_pair_scores(folder: str, query: str, documents: list[str]) -> list[float]:
    """transformers' cross-encoder: each (query, document) tokenized as a pair, sigmoid of its one logit."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        batch = tokenizer([query] * len(documents), documents, padding=True, return_tensors="pt")
        return torch.sigmoid(model(**batch).logits[:, 0]).tolist()


def model_name(url: str) -> str:
    return openai_client(url).models.list().data[0].id


def test_openai_embeddings_equal_sentence_transformers(embed_url, bert_folder):
    client = openai_client(embed_url)
    expected = st_embeddings(bert_folder, TEXTS)
    default = client.embeddings.create(input=TEXTS, model=model_name(embed_url))  # base64 on the wire
    floats = client.embeddings.create(input=TEXTS, model=model_name(embed_url), encoding_format="float")
    assert [d.index for d in default.data] == list(range(len(TEXTS))) and default.object == "list"
    assert np.array_equal(np.array([d.embedding for d in default.data], dtype=np.float32),
                          np.array([d.embedding for d in floats.data], dtype=np.float32))
    assert cosines([d.embedding for d in default.data], expected).min() >= MIN_COSINE
    assert np.allclose(np.linalg.norm([d.embedding for d in default.data], axis=-1), 1.0, atol=1e-5)
    from transformers import AutoTokenizer
    num_tokens = sum(len(ids) for ids in AutoTokenizer.from_pretrained(bert_folder)(TEXTS)["input_ids"])
    assert default.usage.prompt_tokens == default.usage.total_tokens == num_tokens


def test_token_ids_dimensions_and_a_single_text(embed_url, bert_folder):
    from transformers import AutoTokenizer
    client = openai_client(embed_url)
    ids = AutoTokenizer.from_pretrained(bert_folder)(TEXTS[0])["input_ids"]
    by_text = client.embeddings.create(input=TEXTS[0], model=model_name(embed_url)).data[0].embedding
    by_ids = client.embeddings.create(input=ids, model=model_name(embed_url)).data[0].embedding
    by_id_lists = client.embeddings.create(input=[ids, ids], model=model_name(embed_url)).data
    assert by_text == by_ids  # one prompt alone in its step either way
    assert np.allclose([d.embedding for d in by_id_lists], [by_text, by_text], atol=1e-6)
    # Matryoshka: the first 16 values, normalised again
    short = client.embeddings.create(input=TEXTS[0], model=model_name(embed_url), dimensions=16).data[0].embedding
    head = np.asarray(by_text[:16], dtype=np.float64)
    assert len(short) == 16 and np.allclose(short, head / np.linalg.norm(head), atol=1e-6)


def test_classify_answers_each_input_in_vllms_shape(rerank_url, reranker_folder):
    """/v1/classify on a one-label cross-encoder: each text alone, the sigmoid of its logit, as
    transformers gives it, in the list envelope the other pooling endpoints share."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(reranker_folder)
    model = AutoModelForSequenceClassification.from_pretrained(reranker_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = [torch.sigmoid(model(**tokenizer(text, return_tensors="pt")).logits[0, 0]).item()
                    for text in TEXTS[:2]]
    status, text = post_json(f"{rerank_url}/v1/classify", {"model": model_name(rerank_url), "input": TEXTS[:2]})
    assert status == 200, text
    body = json.loads(text)
    assert body["id"].startswith("classify-") and body["object"] == "list" and isinstance(body["created"], int)
    assert body["model"] == model_name(rerank_url)
    label = AutoConfig.from_pretrained(reranker_folder).id2label[0]
    assert [(d["index"], d["label"], d["num_classes"]) for d in body["data"]] == [(0, label, 1), (1, label, 1)]
    assert np.allclose([d["probs"][0] for d in body["data"]], expected, atol=1e-5)
    num_tokens = sum(len(tokenizer(text).input_ids) for text in TEXTS[:2])
    assert body["usage"] == {"prompt_tokens": num_tokens, "total_tokens": num_tokens}


def test_models_lists_the_task(embed_url, rerank_url):
    assert openai_client(embed_url).models.list().data[0].model_extra["task"] == "embed"
    assert openai_client(rerank_url).models.list().data[0].model_extra["task"] == "classify"


def test_bad_input_is_a_400_and_the_service_keeps_serving(embed_url):
    name = model_name(embed_url)
    for body, param in [({"input": []}, "input"), ({"input": "x", "dimensions": 100000}, "dimensions"),
                        ({"input": [1, 2, 10 ** 9]}, "input"), ({"input": "x", "encoding_format": "hex"}, None),
                        ({"input": [[1, 2], "text"]}, "input"), ({"input": list(range(5, 1000))}, "input")]:
        status, text = post_json(f"{embed_url}/v1/embeddings", {"model": name, **body})
        error = json.loads(text)["error"]
        assert status == 400 and error["message"], (body, text)
        assert param is None or error["param"] == param, (body, error)
    status, text = post_json(f"{embed_url}/v1/embeddings", {"model": "other", "input": "x"})
    assert status == 404
    assert len(openai_client(embed_url).embeddings.create(input="still serving", model=name).data) == 1


def test_each_kind_of_model_refuses_the_others_endpoints(embed_url, rerank_url, tmp_path):
    embed_client = openai_client(embed_url)
    for call in (lambda: embed_client.completions.create(model=model_name(embed_url), prompt="hi", max_tokens=2),
                 lambda: embed_client.chat.completions.create(model=model_name(embed_url),
                                                              messages=[{"role": "user", "content": "hi"}])):
        with pytest.raises(BadRequestError, match="--task generate") as refused:
            call()
        assert refused.value.code == "wrong_model_task"
    status, text = post_json(f"{embed_url}/v1/classify", {"input": "x"})
    assert status == 400 and "--task classify" in json.loads(text)["error"]["message"]
    status, text = post_json(f"{rerank_url}/v1/embeddings", {"input": "x"})
    assert status == 400 and "--task embed" in json.loads(text)["error"]["message"]
    llama = make_llama_folder(str(tmp_path / "llama"))
    with LocalCluster(llama, 1, worker_args=TEST_WORKER_ARGS) as generative:
        url = start_gateways(generative, [])[0]
        for path, body in [("/v1/embeddings", {"input": "x"}), ("/v1/score", {"text_1": "a", "text_2": "b"}),
                           ("/v1/rerank", {"query": "a", "documents": ["b"]}), ("/v1/classify", {"input": "x"})]:
            status, text = post_json(url + path, body)
            error = json.loads(text)["error"]
            assert status == 400 and error["code"] == "wrong_model_task" and "--task generate" in error["message"]


def test_score_and_rerank_equal_transformers_cross_encoder(rerank_url, reranker_folder):
    documents = TEXTS
    expected = hf_pair_scores(reranker_folder, QUERY, documents)
    status, text = post_json(f"{rerank_url}/v1/score", {"text_1": QUERY, "text_2": documents})
    body = json.loads(text)
    assert status == 200 and body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert np.allclose([d["score"] for d in body["data"]], expected, atol=1e-5)
    pairwise = json.loads(post_json(f"{rerank_url}/v1/score", {"text_1": [QUERY, QUERY], "text_2": documents[:2]})[1])
    assert np.allclose([d["score"] for d in pairwise["data"]], expected[:2], atol=1e-5)
    order = sorted(range(len(documents)), key=lambda i: -expected[i])
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        status, text = post_json(rerank_url + path, {"query": QUERY, "documents": documents, "top_n": 3})
        body = json.loads(text)
        assert status == 200 and [r["index"] for r in body["results"]] == order[:3]
        assert [r["document"]["text"] for r in body["results"]] == [documents[i] for i in order[:3]]
        assert np.allclose([r["relevance_score"] for r in body["results"]], [expected[i] for i in order[:3]],
                           atol=1e-5)
        assert body["usage"]["total_tokens"] > 0
    status, text = post_json(f"{rerank_url}/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert status == 400
    status, text = post_json(f"{rerank_url}/v1/rerank", {"query": "a", "documents": []})
    assert status == 400 and json.loads(text)["error"]["param"] == "documents"


def test_an_embedder_scores_by_cosine(embed_url, bert_folder):
    expected = st_embeddings(bert_folder, [QUERY, *TEXTS])
    status, text = post_json(f"{embed_url}/v1/score", {"text_1": QUERY, "text_2": TEXTS})
    assert status == 200
    assert np.allclose([d["score"] for d in json.loads(text)["data"]], cosines(expected[:1], expected[1:]), atol=1e-5)


# ---- batch files -------------------------------------------------------------------------------

def embedding_lines(num_lines: int, bad_every: int = 0) -> tuple[list[dict], set[int]]:
    """/v1/embeddings lines (every bad_every-th one with an input the endpoint refuses)."""
    lines, bad = [], set()
    for i in range(num_lines):
        body = {"input": f"line {i}: {TEXTS[i % len(TEXTS)]}"}
        if i % 3 == 1:
            body["encoding_format"] = "base64"
        if bad_every and i % bad_every == bad_every - 1:
            body, _ = {"input": []}, bad.add(i)
        lines.append({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/embeddings", "body": body})
    return lines, bad


def write_jsonl(path, lines: list[dict]) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    return str(path)


def embedding_of(data: dict) -> np.ndarray:
    import base64
    value = data["embedding"]
    return np.frombuffer(base64.b64decode(value), "<f4") if isinstance(value, str) else np.asarray(value, np.float32)


def check_embedding_outputs(outputs: list[dict], lines: list[dict], bad: set[int], folder: str) -> None:
    assert sorted(o["custom_id"] for o in outputs) == sorted(line["custom_id"] for line in lines)
    by_id = {o["custom_id"]: o for o in outputs}
    good = [i for i in range(len(lines)) if i not in bad]
    expected = st_embeddings(folder, [lines[i]["body"]["input"] for i in good])
    got = [embedding_of(by_id[f"req-{i}"]["response"]["body"]["data"][0]) for i in good]
    assert cosines(got, expected).min() >= MIN_COSINE
    for i in bad:
        output = by_id[f"req-{i}"]
        assert output["response"]["status_code"] == 400 and output["error"]["code"] == "invalid_params"


def test_run_batch_answers_embedding_score_and_rerank_lines(embed_cluster, bert_folder, tmp_path):
    from transformers import AutoTokenizer
    lines, bad = embedding_lines(300, bad_every=50)
    lines.append({"custom_id": "texts", "url": "/v1/embeddings", "body": {"input": TEXTS}})
    lines.append({"custom_id": "score", "url": "/v1/score", "body": {"text_1": QUERY, "text_2": TEXTS}})
    lines.append({"custom_id": "rerank", "url": "/v1/rerank", "body": {"query": QUERY, "documents": TEXTS}})
    src, out = write_jsonl(tmp_path / "in.jsonl", lines), str(tmp_path / "out.jsonl")
    done = subprocess.run([sys.executable, "-m", "stepserve.cli", "run-batch", "--address", embed_cluster.address,
                           "-i", src, "-o", out], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{len(lines) - len(bad)} completed, {len(bad)} failed" in done.stdout
    assert float(done.stdout.split(" prompt tokens/s")[0].rsplit(" ", 1)[1]) > 0  # embedding lines generate none
    with open(out) as f:
        outputs = [json.loads(line) for line in f]
    pooled = [o for o in outputs if o["custom_id"] not in ("texts", "score", "rerank")]
    check_embedding_outputs(pooled, lines[:-3], bad, bert_folder)
    by_id = {o["custom_id"]: o["response"]["body"] for o in outputs}
    texts = by_id["texts"]  # one line of several inputs: each in its place, their tokens in its usage
    assert [d["index"] for d in texts["data"]] == list(range(len(TEXTS)))
    assert cosines([d["embedding"] for d in texts["data"]], st_embeddings(bert_folder, TEXTS)).min() >= MIN_COSINE
    tokenizer = AutoTokenizer.from_pretrained(bert_folder)
    assert texts["usage"]["prompt_tokens"] == sum(len(tokenizer(t)["input_ids"]) for t in TEXTS)
    expected = st_embeddings(bert_folder, [QUERY, *TEXTS])
    scores = cosines(expected[:1], expected[1:])
    assert np.allclose([d["score"] for d in by_id["score"]["data"]], scores, atol=1e-5)
    assert [r["index"] for r in by_id["rerank"]["results"]] == sorted(range(len(TEXTS)), key=lambda i: -scores[i])


def test_batch_api_embeddings(embed_cluster, bert_folder, tmp_path):
    url = embed_cluster.start_gateway(["--batch-dir", str(tmp_path / "batches")])
    client = openai_client(url)
    lines, bad = embedding_lines(60, bad_every=20)
    with open(write_jsonl(tmp_path / "in.jsonl", lines), "rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    deadline = time.monotonic() + 240
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, batch.request_counts
        time.sleep(0.1)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(lines) - len(bad), len(bad))
    outputs = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    outputs += [json.loads(line) for line in client.files.content(batch.error_file_id).text.splitlines()]
    check_embedding_outputs(outputs, lines, bad, bert_folder)


def test_bench_throughput_task_embed(bert_folder):
    done = subprocess.run([sys.executable, "-m", "stepserve.cli", "bench", "throughput", "--model", bert_folder,
                           "--task", "embed", "--enforce-eager", "--num-prompts", "64", "--input-len", "16", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["task"] == "embed" and result["num_prompts"] == 64 and result["embedding_size"] == 64
    assert result["tokens_per_second"] == pytest.approx(16 * result["requests_per_second"], rel=1e-3)
    assert result["output_tokens_per_second"] == 0 and result["requests_per_second"] > 0
