"""Gemma 2 through real scheduler and worker processes (compiled worker, real ZeroMQ): greedy
tokens equal transformers' on a tight KV pool (preemption) with chunked prefills, its window (8
tokens) and soft-caps in play; logprobs see the final-logit soft-cap; bfloat16 serves too.
"""
import torch

from stepserve import LLM, SamplingParams
from tests.e2e_helpers import hf_greedy
from tests.hf_model_folders import make_gemma2_folder

MAX_TOKENS = 12
# 24 blocks of 4 tokens: two or three requests at a time, so growing ones preempt others; a
# 16-token budget chunks the long prompts.
WORKER_ARGS = ["--num-gpu-blocks", "24", "--threads", "1"]


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(4, 1000, (n,), generator=generator).tolist() for n in (3, 40, 17, 9, 30, 5, 23, 12)]


def _hf_cumulative_logprob(folder: str, prompt: list[int], tokens: list[int]) -> float:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]  # soft-capped
    return float(logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).sum())


def test_gemma2_greedy_and_logprobs_equal_transformers_through_real_processes(tmp_path):
    folder = make_gemma2_folder(str(tmp_path / "gemma2"))
    prompts = _prompts()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    with LLM(model=folder, dtype="float32", block_size=4, max_num_batched_tokens=16,
             worker_args=WORKER_ARGS) as llm:
        outputs = llm.generate(prompts, params)
        assert llm.client.health().num_preemptions > 0, "the tight pool must force preemption"
    tokens = [o.outputs[0].token_ids for o in outputs]
    assert tokens == hf_greedy(folder, prompts, MAX_TOKENS)
    # The final cap (0.5) squeezes every logit into [-0.5, 0.5]: uncapped logprobs are far off.
    assert abs(outputs[1].outputs[0].cumulative_logprob
               - _hf_cumulative_logprob(folder, prompts[1], tokens[1])) < 1e-3


def test_gemma2_in_bfloat16_serves_full_lengths(tmp_path):
    folder = make_gemma2_folder(str(tmp_path / "gemma2"))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    with LLM(model=folder, dtype="bfloat16", block_size=4, max_num_batched_tokens=16, enforce_eager=True,
             worker_args=WORKER_ARGS) as llm:
        outputs = llm.generate(_prompts(), params)
    for output in outputs:
        completion = output.outputs[0]
        assert len(completion.token_ids) == MAX_TOKENS and completion.finish_reason == "length"
        assert all(0 <= t < 1000 for t in completion.token_ids)
        # Finite and plausible: bounded logits (the cap) over 1,000 tokens give about -ln(1000).
        assert all(-10 < step.logprob <= 0 for step in completion.token_logprobs)
