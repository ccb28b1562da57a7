"""Prompt logprobs (SamplingParams.prompt_logprobs) through real processes: equal to
log_softmax of transformers' float32 logits on the prompt, with chunked prefill splitting the
prompt, and again for a prompt whose blocks the prefix cache holds."""
import pytest
import torch

from stepserve import LLM, SamplingParams
from tests.hf_model_folders import make_llama_folder

PROMPTS = [[4 + (13 * i) % 900 for i in range(45)], [7, 8, 9, 10, 11], [300, 301]]
K = 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_llama_folder(str(tmp_path_factory.mktemp("prompt_logprobs") / "llama"), seed=5)


def _transformers_logprobs(folder: str, prompt: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)  # [n, V]


def test_prompt_logprobs_equal_transformers_with_chunked_prefill(folder):
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=K)
    # 16 tokens a step: the 45-token prompt is scored in three chunks.
    with LLM(model=folder, dtype="float32", kv_cache_gb=0.05, max_num_batched_tokens=16, enforce_eager=True) as llm:
        first = llm.generate(PROMPTS, params, use_tqdm=False)
        cached = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0]  # its full blocks are cached now
        plain = llm.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)[0]
    assert plain.prompt_logprobs is None
    for prompt, output in zip(PROMPTS + PROMPTS[:1], first + [cached]):
        expected = _transformers_logprobs(folder, prompt)
        assert len(output.prompt_logprobs) == len(prompt) and output.prompt_logprobs[0] is None
        for position, entry in enumerate(output.prompt_logprobs[1:], start=1):
            token = prompt[position]
            want = expected[position - 1]
            assert abs(entry[token].logprob - want[token].item()) < 1e-4
            top = want.topk(K)
            assert [t for t in entry if entry[t].rank is not None] == top.indices.tolist()
            for t, lp in zip(top.indices.tolist(), top.values.tolist()):
                assert abs(entry[t].logprob - lp) < 1e-4 and entry[t].rank == top.indices.tolist().index(t) + 1


def test_a_prompt_scored_again_after_recompute_keeps_each_entry_once():
    from scheduler_svc.request import Request
    request = Request("r", list(range(10, 16)), SamplingParams(prompt_logprobs=0))
    request.add_prompt_logprobs(1, ["a1", "a2"])  # chunk [0, 2) scores prompt tokens 1, 2
    request.add_prompt_logprobs(3, ["a3"])
    request.add_prompt_logprobs(1, ["b1", "b2", "b3", "b4"])  # recomputed from the start: 4 is new
    request.add_prompt_logprobs(5, ["b5"])
    assert request.prompt_logprobs == ["a1", "a2", "a3", "b4", "b5"]
