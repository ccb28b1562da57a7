"""Penalties, logit bias, bad words and allowed tokens: greedy outputs through real processes
equal a reference written from vLLM's definitions over transformers' float32 logits."""
from collections import Counter

import pytest
import torch

from stepserve import LLM, SamplingParams
from tests.hf_model_folders import make_llama_folder
from worker_svc.byte_tokenizer import build_byte_tokenizer
from worker_svc.logits_processors import bad_words_token_ids

NUM_TOKENS = 12
PROMPTS = [[5, 6, 7, 8, 5, 6], [40, 41, 40, 41, 40], [100, 7, 200, 9, 1, 3, 4]]


def _penalised(logits, prompt, generated, presence=0.0, frequency=0.0, repetition=1.0):
    """vLLM's penalties, one token at a time: repetition over prompt and generated tokens
    (a positive logit divided, a negative one multiplied), then frequency and presence over
    the generated tokens."""
    logits = logits.clone()
    for token in set(prompt) | set(generated):
        logits[token] = logits[token] / repetition if logits[token] > 0 else logits[token] * repetition
    for token, count in Counter(generated).items():
        logits[token] -= frequency * count + presence
    return logits


def _biased(logits, prompt, generated, bias):
    logits = logits.clone()
    for token, value in bias.items():
        logits[token] += value
    return logits


def _allowed(logits, prompt, generated, allowed):
    masked = torch.full_like(logits, float("-inf"))
    masked[allowed] = logits[allowed]
    return masked


def _without_bad_words(logits, prompt, generated, words):
    logits = logits.clone()
    for word in words:
        if len(word) == 1 or generated[len(generated) - len(word) + 1:] == word[:-1]:
            logits[word[-1]] = float("-inf")
    return logits


def _reference(model, prompt: list[int], adjust) -> list[int]:
    generated: list[int] = []
    with torch.inference_mode():
        for _ in range(NUM_TOKENS):
            logits = model(torch.tensor([prompt + generated])).logits[0, -1].float()
            generated.append(int(adjust(logits, prompt, generated).argmax()))
    return generated


BYTE = build_byte_tokenizer(1000)
BAD_WORDS = ["ab", "zq"]
BAD_IDS = bad_words_token_ids(BAD_WORDS, lambda text: BYTE.encode(text, add_special_tokens=False).ids)
# Random weights rarely pick byte tokens: a bias makes "a" and "b" likely, so the bad word "ab"
# (b after a) has something to ban.
AB_BIAS = {BYTE.token_to_id("a"): 60.0, BYTE.token_to_id("b"): 59.0}
CASES = [  # (sampling fields, reference adjustment)
    ({}, lambda logits, p, g: logits),
    ({"presence_penalty": 1.5}, lambda logits, p, g: _penalised(logits, p, g, presence=1.5)),
    ({"frequency_penalty": 0.7}, lambda logits, p, g: _penalised(logits, p, g, frequency=0.7)),
    ({"repetition_penalty": 1.8}, lambda logits, p, g: _penalised(logits, p, g, repetition=1.8)),
    ({"repetition_penalty": 0.6, "presence_penalty": -0.5, "frequency_penalty": 0.3},
     lambda logits, p, g: _penalised(logits, p, g, presence=-0.5, frequency=0.3, repetition=0.6)),
    ({"logit_bias": {17: 3.0, 18: 100.0, 19: -100.0}},
     lambda logits, p, g: _biased(logits, p, g, {17: 3.0, 18: 100.0, 19: -100.0})),
    ({"allowed_token_ids": [300, 301, 302, 303]}, lambda logits, p, g: _allowed(logits, p, g, [300, 301, 302, 303])),
    ({"bad_words": BAD_WORDS, "logit_bias": AB_BIAS},
     lambda logits, p, g: _biased(_without_bad_words(logits, p, g, BAD_IDS), p, g, AB_BIAS)),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_llama_folder(str(tmp_path_factory.mktemp("penalties") / "llama"), seed=3)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_greedy_with_each_adjustment_matches_the_reference(folder, async_scheduling):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    expected = [[_reference(model, prompt, adjust) for prompt in PROMPTS] for _, adjust in CASES]
    # The compiled worker: greedy rows without adjustments take the fused LM head + argmax,
    # the others must leave it for the logits path, all in one batch.
    params = [SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True, **fields)
              for fields, _ in CASES for _ in PROMPTS]
    # With async scheduling, 10 KV blocks of 16 tokens for 24 requests: some are preempted by
    # recompute and come back with their tokens, from which the worker rebuilds their counts.
    worker_args = ["--num-gpu-blocks", "10"] if async_scheduling else []
    with LLM(model=folder, dtype="float32", kv_cache_gb=0.05, async_scheduling=async_scheduling,
             enforce_eager=async_scheduling, worker_args=worker_args) as llm:
        outputs = llm.generate(PROMPTS * len(CASES), params, use_tqdm=False)
        assert (llm.client.health().num_preemptions > 0) == async_scheduling
    got = [[o.outputs[0].token_ids for o in outputs[i:i + len(PROMPTS)]]
           for i in range(0, len(outputs), len(PROMPTS))]
    for (fields, _), want, have in zip(CASES, expected, got):
        assert have == want, fields
    plain = expected[0]
    assert all(case != plain for case in expected[1:]), "every adjustment changes some output"
    assert all(t in (300, 301, 302, 303) for seq in got[6] for t in seq)


def test_bad_input_is_refused_for_that_request_alone():
    for fields in ({"logit_bias": {5: 101.0}}, {"presence_penalty": 2.5}, {"repetition_penalty": 0.0},
                   {"allowed_token_ids": []}):
        with pytest.raises(ValueError):
            from client_sdk.choice import validated
            validated(SamplingParams(**fields))
