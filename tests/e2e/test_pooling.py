"""Pooling models end to end (real scheduler, worker and SDK): LLM.embed equals
sentence-transformers' encode, LLM.score and LLM.classify equal transformers'
...ForSequenceClassification, and pooling requests fail alone where they must."""
import numpy as np
import pytest
import torch

from client_sdk import AsyncClient, RequestError
from stepserve import LLM, PoolingParams
from tests.hf_model_folders import make_bert_classifier_folder, make_bert_folder, make_qwen3_embedding_folder

TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a", "stepserve embeds text " * 3]
LLM_ARGS = dict(dtype="float32", kv_cache_gb=0.05, enforce_eager=True, data_parallel_size=1)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def sentence_transformers_encode(folder: str, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(folder, device="cpu").encode(texts, convert_to_numpy=True)


@pytest.mark.parametrize("make_folder", [make_bert_folder, make_qwen3_embedding_folder], ids=["bert", "qwen3"])
def test_llm_embed_equals_sentence_transformers_encode(make_folder, tmp_path):
    folder = make_folder(str(tmp_path / "model"))
    expected = sentence_transformers_encode(folder, TEXTS)
    with LLM(folder, **LLM_ARGS) as llm:
        outputs = llm.embed(TEXTS, use_tqdm=False)
        assert llm.client.model_info().pooling.task == "embed"
        ids = [o.prompt_token_ids for o in outputs]
        by_ids = llm.embed([{"prompt_token_ids": i} for i in ids], use_tqdm=False)
        short = llm.embed(TEXTS, PoolingParams(dimensions=16), use_tqdm=False)
    got = np.array([o.outputs.embedding for o in outputs])
    assert got.shape == expected.shape
    assert cosines(got, expected).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(expected, axis=-1), rtol=1e-4)
    assert [o.outputs.embedding for o in by_ids] == [o.outputs.embedding for o in outputs]
    # Matryoshka: the first 16 values, normalised again (vLLM's dimensions)
    truncated = expected[:, :16] / np.linalg.norm(expected[:, :16], axis=-1, keepdims=True)
    assert cosines([o.outputs.embedding for o in short], truncated).min() >= 0.99999
    assert np.allclose(np.linalg.norm([o.outputs.embedding for o in short], axis=-1), 1.0, atol=1e-5)


def test_llm_score_and_classify_equal_transformers_sequence_classification(tmp_path):
    from transformers import AutoTokenizer, BertForSequenceClassification
    cross_encoder = make_bert_classifier_folder(str(tmp_path / "cross-encoder"), num_labels=1)
    classifier = make_bert_classifier_folder(str(tmp_path / "classifier"), seed=1, num_labels=3)
    query, documents = "where is the cat", ["the cat sat on the mat", "stocks fell today", "a cat, here"]

    def logits(folder, *texts):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = BertForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.inference_mode():
            return [model(**tokenizer(*text, return_tensors="pt", return_token_type_ids=True)).logits[0]
                    for text in zip(*texts)]

    with LLM(cross_encoder, **LLM_ARGS) as llm:
        scores = llm.score(query, documents, use_tqdm=False)
        pairwise = llm.score([query] * 3, documents, use_tqdm=False)
    expected = [torch.sigmoid(x[0]).item() for x in logits(cross_encoder, [query] * 3, documents)]
    np.testing.assert_allclose([s.outputs.score for s in scores], expected, rtol=1e-5, atol=1e-6)
    assert [s.outputs.score for s in pairwise] == [s.outputs.score for s in scores]
    assert np.argsort([s.outputs.score for s in scores]).tolist() == np.argsort(expected).tolist()

    with LLM(classifier, **LLM_ARGS) as llm:
        assert llm.client.model_info().pooling.labels == ["label_0", "label_1", "label_2"]
        probs = llm.classify(documents, use_tqdm=False)
        raw = llm.classify(documents, PoolingParams(activation=False), use_tqdm=False)
        with pytest.raises(ValueError, match="one label"):
            llm.score(query, documents, use_tqdm=False)
    expected = logits(classifier, documents)
    np.testing.assert_allclose([p.outputs.probs for p in probs], [torch.softmax(x, -1).tolist() for x in expected],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([r.outputs.probs for r in raw], [x.tolist() for x in expected], rtol=1e-4, atol=1e-5)


def test_pooling_requests_fail_alone_and_the_service_keeps_serving(tmp_path):
    folder = make_bert_folder(str(tmp_path / "bert"))
    with LLM(folder, max_num_batched_tokens=64, **LLM_ARGS) as llm:
        client: AsyncClient = llm.client._async

        async def calls():
            outputs = [o async for o in client.embed_iter([[5] * 64, [5] * 65, "hello"], request_ids=["a", "b", "c"])]
            with pytest.raises(RequestError, match="max_num_batched_tokens 64") as too_long:
                await client.embed([[5] * 10, [5] * 65])
            with pytest.raises(RequestError, match="pooling model") as generated:
                await client.generate("hello")
            with pytest.raises(RequestError, match="token_type_ids"):
                await client.embed([[5, 6]], pooling_params=PoolingParams(token_type_ids=[0]))
            return dict(outputs), too_long.value, generated.value

        outputs, too_long, generated = llm.client._call(calls())
        assert (too_long.code, generated.code) == ("prompt_too_long", "invalid_params")
        assert [outputs[i].ok for i in range(3)] == [True, False, True]
        assert outputs[1].error_code == "prompt_too_long" and outputs[1].outputs is None
        assert len(outputs[2].outputs.embedding) == 64
        health = llm.client.health()
        assert health.num_free_blocks == health.num_total_blocks


def test_a_generative_model_refuses_pooling_calls():
    with LLM("micro-llama", **LLM_ARGS) as llm:
        with pytest.raises(RequestError, match="this model generates text") as refused:
            llm.embed("hello", use_tqdm=False)
        assert refused.value.code == "invalid_params"
        with pytest.raises(ValueError, match="needs a pooling model"):
            llm.score("hello", ["world"], use_tqdm=False)
        assert llm.generate("hello")[0].outputs[0].finish_reason == "length"  # still serving
