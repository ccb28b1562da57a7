"""Greedy tokens of the same prompts from transformers and from our runner under mixed plans
(tests/plan_player.py): what the model tests compare, family by family."""
import torch

from protocol.sampling import SamplingParams
from tests.plan_player import PlanPlayer
from worker_svc.model_executor import num_compilations
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig

NUM_NEW_TOKENS = 10
PROMPT_LENS = [3, 17, 9, 40]


def sample_prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(4, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENS]


def hf_greedy_each(folder: str, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM
    outputs = []
    for prompt in prompts:  # one at a time: no padding, so positions are plain
        # A fresh model per prompt: transformers' dynamic rope keeps the frequencies of the
        # longest sequence seen until a shorter one resets them, so each output is its prompt's alone.
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=NUM_NEW_TOKENS,
                             min_new_tokens=NUM_NEW_TOKENS, do_sample=False)
        outputs.append(ids[0, len(prompt):].tolist())
    return outputs


def _no_full_logits(hidden):
    raise AssertionError("an all-greedy step computed full logits instead of the forward's greedy head")


def runner_greedy(folder: str, prompts, events, token_budget: int,
                   enforce_eager: bool = False, argmax_only: bool = False) -> list[list[int]]:
    """argmax_only: the requests ignore EOS rather than ban it (min_tokens), so every step's
    sampled rows take the raw argmax: the forward's own greedy head (model_executor.py), and
    never the full logits; generate's min_new_tokens still bans EOS, so an EOS argmax fails."""
    runner = ModelRunner(RunnerConfig(model=folder, dtype="float32", block_size=4,
                                      num_gpu_blocks=128, swap_space_gb=0.001,
                                      enforce_eager=enforce_eager))
    assert runner.num_cpu_blocks >= 32 and runner.executor.compiled != enforce_eager
    compilations_after_warm_up = num_compilations()
    player = PlanPlayer(runner, token_budget=token_budget)
    # min_tokens = max_tokens bans EOS throughout, as min_new_tokens does in generate.
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS)
    if argmax_only:
        params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
        runner.executor.logits = _no_full_logits
    for i, prompt in enumerate(prompts):
        player.add(f"req-{i}", prompt, params)
    outputs = player.run(events)
    assert -1 in {t for r in player.results for t in r.sampled_token_ids}, "no prefill was chunked"
    # Every batch shape of the run (prefills, chunks, decodes, mixes of each) took the graphs
    # compiled at start-up.
    assert num_compilations() == compilations_after_warm_up
    return [outputs[f"req-{i}"] for i in range(len(prompts))]



# Budget 16: the 17- and 40-token prompts are chunked over several steps while the others
# decode. Step 4 preempts req-0 mid-decode (recompute); step 6 swaps req-1 out, step 7 back in.
EVENTS = {4: {"preempt": ("req-0",)}, 6: {"swap_out": ("req-1",)}}
