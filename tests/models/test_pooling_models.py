"""Pooling models through the real ModelRunner against sentence-transformers and transformers:
embeddings equal SentenceTransformer.encode (BERT mean and CLS, XLM-RoBERTa, a Qwen3
last-token embedder), classifier probabilities and logits equal ...ForSequenceClassification
(BERT with segment ids of a pair, XLM-RoBERTa with one label), eager and compiled."""
import numpy as np
import pytest
import torch

from protocol.pooling import PoolingParams
from protocol.sampling import SamplingParams
from protocol.worker_messages import NewRequestData, StepPlan
from tests.hf_model_folders import (make_bert_classifier_folder, make_bert_folder, make_qwen3_embedding_folder,
                                    make_xlm_roberta_classifier_folder, make_xlm_roberta_folder)
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig

# Unequal lengths (the padded layout with a key mask), and two of one length in a batch alone
# (the packed tokens as the layout itself).
TEXTS = ["hello world", "a", "the quick brown fox jumps over the lazy dog", "stepserve pools"]
EQUAL_TEXTS = ["abcdefgh", "12345678"]
PAIRS = [("what is a fox", "a fox is an animal"), ("why", "because the sky is blue"), ("x", "y")]
BLOCK_SIZE = 4


def pool(runner: ModelRunner, prompts: list[list[int]], params: list[PoolingParams], step_id: int = 0):
    """One plan of pooling requests -> the StepResult (their blocks: the first free ones)."""
    news, next_block = [], 0
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        num_blocks = -(-len(prompt) // BLOCK_SIZE) if runner.spec.num_attention_layers else 0
        news.append(NewRequestData(f"req-{step_id}-{i}", prompt, len(prompt), SamplingParams(max_tokens=1),
                                   list(range(next_block, next_block + num_blocks)), 0, len(prompt), p))
        next_block += num_blocks
    result = runner.execute(StepPlan(step_id=step_id, finished_ids=[], preempted_ids=[], new_requests=news,
                                     running_requests=[]))
    assert result.error is None, result.error
    assert result.sampled_token_ids == [-1] * len(prompts)
    runner.execute(StepPlan(step_id=step_id + 1, finished_ids=[n.request_id for n in news], preempted_ids=[],
                            new_requests=[], running_requests=[]))
    assert runner.requests.num_requests == 0
    return result


def vectors(result, count: int) -> np.ndarray:
    return np.stack([np.frombuffer(result.pooled[i], "<f4") for i in range(count)])


def make_runner(folder: str, enforce_eager: bool = True, **options) -> ModelRunner:
    return ModelRunner(RunnerConfig(model=folder, dtype="float32", block_size=BLOCK_SIZE, num_gpu_blocks=256,
                                    enforce_eager=enforce_eager, **options))


def assert_same_directions(ours: np.ndarray, theirs: np.ndarray, same_norms: bool = True) -> None:
    cosine = (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
    assert cosine.min() >= 0.99999, cosine
    if same_norms:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), np.linalg.norm(theirs, axis=-1), rtol=1e-4)


def check_embeddings(folder: str, texts: list[str], enforce_eager: bool = True) -> ModelRunner:
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(folder, device="cpu")
    expected = st.encode(texts, convert_to_numpy=True, batch_size=len(texts))
    prompts = [st.tokenizer(text)["input_ids"] for text in texts]
    runner = make_runner(folder, enforce_eager)
    result = pool(runner, prompts, [PoolingParams() for _ in texts])
    assert_same_directions(vectors(result, len(texts)), expected)
    return runner


@pytest.fixture(scope="module")
def bert_mean(tmp_path_factory) -> str:
    return make_bert_folder(str(tmp_path_factory.mktemp("bert-mean")), pooling_mode="mean")


def test_bert_mean_embeddings_equal_sentence_transformers(bert_mean):
    runner = check_embeddings(bert_mean, TEXTS + EQUAL_TEXTS)
    hello = runner.hello("w")
    assert hello.pooling.task == "embed" and hello.pooling.pooling_type == "MEAN" and hello.pooling.normalize
    assert hello.pooling.size == 64 and hello.pooling.bidirectional
    assert runner.caches.kv == [] and hello.num_gpu_blocks == 256  # no KV cache: blocks as bookkeeping
    check_embeddings(bert_mean, EQUAL_TEXTS)


def test_bert_compiled_embeddings_equal_sentence_transformers(bert_mean):
    runner = check_embeddings(bert_mean, TEXTS, enforce_eager=False)
    assert runner.executor.compiled


def test_bert_cls_embeddings_equal_sentence_transformers(tmp_path):
    check_embeddings(make_bert_folder(str(tmp_path), pooling_mode="cls"), TEXTS)


def test_xlm_roberta_embeddings_equal_sentence_transformers(tmp_path):
    runner = check_embeddings(make_xlm_roberta_folder(str(tmp_path)), TEXTS)
    assert runner.max_model_len == 128  # 130 positions, numbered from pad_token_id + 1 = 2


def test_qwen3_last_token_embeddings_equal_sentence_transformers(tmp_path):
    runner = check_embeddings(make_qwen3_embedding_folder(str(tmp_path)), TEXTS)
    pooling = runner.hello("w").pooling
    assert pooling.pooling_type == "LAST" and not pooling.bidirectional and runner.caches.kv


def test_dimensions_and_normalize_per_request(bert_mean):
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(bert_mean, device="cpu")
    prompts = [st.tokenizer(text)["input_ids"] for text in TEXTS[:2]]
    normalised = st.encode(TEXTS[:2], convert_to_numpy=True)  # by its Normalize module
    truncated = st.encode(TEXTS[:2], truncate_dim=16, normalize_embeddings=True, convert_to_numpy=True)
    runner = make_runner(bert_mean, normalize=False)  # the override: the folder's Normalize is off
    assert not runner.hello("w").pooling.normalize
    result = pool(runner, prompts * 2, [PoolingParams(), PoolingParams(), PoolingParams(dimensions=16, normalize=True),
                                        PoolingParams(dimensions=16, normalize=True)])
    whole = vectors(result, 2)
    assert_same_directions(whole, normalised, same_norms=False)
    assert np.linalg.norm(whole[0]) > 1.5  # not normalised (a mean of LayerNorm outputs)
    assert_same_directions(np.stack([np.frombuffer(result.pooled[i], "<f4") for i in (2, 3)]), truncated)
    too_wide = pool(runner, prompts[:1], [PoolingParams(dimensions=65)], step_id=10)
    assert "dimensions 65" in too_wide.request_errors[0] and 0 not in too_wide.pooled


def hf_logits(folder: str, model_class, pairs, with_types: bool):
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    model = model_class.from_pretrained(folder, dtype=torch.float32).eval()
    encodings = [tokenizer.encode(a, b) for a, b in pairs]
    logits = []
    for e in encodings:
        kwargs = {"token_type_ids": torch.tensor([e.type_ids])} if with_types else {}
        with torch.no_grad():
            logits.append(model(torch.tensor([e.ids]), **kwargs).logits[0].numpy())
    return encodings, np.stack(logits)


def test_bert_classifier_equals_transformers(tmp_path):
    from transformers import BertForSequenceClassification
    folder = make_bert_classifier_folder(str(tmp_path), num_labels=3)
    encodings, logits = hf_logits(folder, BertForSequenceClassification, PAIRS, with_types=True)
    assert any(1 in e.type_ids for e in encodings)
    runner = make_runner(folder)
    info = runner.hello("w").pooling
    assert (info.task, info.size, info.labels, info.pooling_type) == ("classify", 3, ["label_0", "label_1", "label_2"],
                                                                      "CLS")
    prompts = [e.ids for e in encodings]
    result = pool(runner, prompts * 2, [PoolingParams(task="classify", token_type_ids=e.type_ids) for e in encodings]
                  + [PoolingParams(task="classify", token_type_ids=e.type_ids, activation=False) for e in encodings])
    ours = vectors(result, 2 * len(PAIRS))
    np.testing.assert_allclose(ours[:3], torch.softmax(torch.tensor(logits), -1).numpy(), atol=1e-5)
    np.testing.assert_allclose(ours[3:], logits, atol=1e-5)
    # Without the segment ids (all zeros) the scores differ: they reach the model.
    zeros = vectors(pool(runner, prompts, [PoolingParams(task="classify", activation=False)] * 3, step_id=5), 3)
    assert np.abs(zeros - logits).max() > 1e-3


def test_xlm_roberta_reranker_equals_transformers(tmp_path):
    from transformers import XLMRobertaForSequenceClassification
    folder = make_xlm_roberta_classifier_folder(str(tmp_path), num_labels=1)
    encodings, logits = hf_logits(folder, XLMRobertaForSequenceClassification, PAIRS, with_types=False)
    runner = make_runner(folder, enforce_eager=False)
    result = pool(runner, [e.ids for e in encodings], [PoolingParams(task="classify")] * len(PAIRS))
    scores = vectors(result, len(PAIRS))
    assert scores.shape == (3, 1)
    np.testing.assert_allclose(scores, torch.sigmoid(torch.tensor(logits)).numpy(), atol=1e-5)
    assert len(set(np.argsort(scores[:, 0]).tolist())) == 3 and np.ptp(scores) > 1e-3  # an order to rank by


def test_requests_of_the_other_kind_fail_the_step(bert_mean, tmp_path):
    runner = make_runner(bert_mean)
    plan = StepPlan(step_id=0, finished_ids=[], preempted_ids=[], running_requests=[], new_requests=[
        NewRequestData("gen", [2, 50, 3], 3, SamplingParams(max_tokens=4), [], 0, 3)])
    assert "asks for generation" in runner.execute(plan).error
    plan.new_requests[0].pooling = PoolingParams(task="classify")
    assert "asks for classify" in runner.execute(plan).error
    plan.new_requests[0].pooling = PoolingParams(token_type_ids=[0, 1])
    assert "2 token_type_ids for a prompt of 3" in runner.execute(plan).error
