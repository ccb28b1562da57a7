"""Mamba and Jamba through the real ModelRunner, driven by hand-built StepPlans (PlanPlayer).

What the runner must get right for state models: a slot is released only by finished_ids /
preempted_ids, a request re-sent after a recompute preemption starts from a zeroed slot, and a
slot freed by one request and taken by the next carries nothing over.
"""
import pytest
import torch

from protocol.sampling import SamplingParams
from tests.mamba_model_folders import make_jamba_folder, make_mamba_folder
from tests.plan_player import PlanPlayer
from tests.state_model_helpers import hf_greedy, random_prompts
from worker_svc.models.state_layout import SeqGroup
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig

NUM_NEW = 8
# Budget 8 chunks the 17- and 12-token prompts. Step 1 preempts r1 between its prefill chunks,
# step 5 preempts r0 mid-decode; both come back as new requests with num_computed_tokens 0.
EVENTS = {1: {"preempt": ("r1",)}, 5: {"preempt": ("r0",)}}


def make_runner(model: str, num_state_slots: int, dtype: str = "float32") -> ModelRunner:
    # num_gpu_blocks: Mamba has no KV, but PlanPlayer hands out block ids all the same.
    return ModelRunner(RunnerConfig(model=model, dtype=dtype, block_size=4, num_gpu_blocks=96,
                                    num_state_slots=num_state_slots))


def greedy(max_tokens: int = NUM_NEW) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def flush(player: PlanPlayer) -> None:
    """Send the last finished_ids (they ride on the next plan) and check nothing leaked."""
    player.step()
    runner = player.runner
    assert runner.state_slots.num_in_use == 0
    runner.check_integrity()


@pytest.fixture(scope="module", params=["mamba", "jamba"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "mamba":
        hf_model = make_mamba_folder(str(path), tie_word_embeddings=False)
    else:
        hf_model = make_jamba_folder(str(path))
    return hf_model, str(path)


def run_with_preemption(folder: str) -> tuple[dict[str, list[int]], PlanPlayer]:
    player = PlanPlayer(make_runner(folder, num_state_slots=4), token_budget=8)
    for rid, prompt in random_prompts([3, 17, 9, 12]).items():
        player.add(rid, prompt, greedy())
    return player.run(EVENTS), player


def test_chunks_and_preemption_match_transformers(folder):
    hf_model, path = folder
    outputs, player = run_with_preemption(path)
    assert -1 in {t for r in player.results for t in r.sampled_token_ids}, "nothing chunked"
    for rid, prompt in random_prompts([3, 17, 9, 12]).items():
        assert outputs[rid] == hf_greedy(hf_model, prompt, NUM_NEW), rid
    flush(player)


def test_fresh_requests_ignore_a_dirty_slot(folder, monkeypatch):
    """Belt and braces: even if the runner handed out slots full of noise, a request with
    num_computed_tokens 0 (first chunk, or re-sent after preemption) starts from zeros."""
    hf_model, path = folder
    monkeypatch.setattr(ModelRunner, "_take_state_slot", _take_slot_full_of_noise)
    outputs, _ = run_with_preemption(path)
    for rid, prompt in random_prompts([3, 17, 9, 12]).items():
        assert outputs[rid] == hf_greedy(hf_model, prompt, NUM_NEW), rid


def test_dirty_slot_is_caught_when_the_model_trusts_it(folder, monkeypatch):
    """The two tests above can fail: a model that resumed fresh requests from their slot's
    contents gives different tokens on the same plans."""
    hf_model, path = folder
    monkeypatch.setattr(ModelRunner, "_take_state_slot", _take_slot_full_of_noise)
    monkeypatch.setattr(SeqGroup, "initial_state", lambda self, state: state[self.slots])
    outputs, _ = run_with_preemption(path)
    prompts = random_prompts([3, 17, 9, 12])
    assert any(outputs[r] != hf_greedy(hf_model, prompts[r], NUM_NEW) for r in prompts)


def _take_slot_full_of_noise(self, request_id: str, row: int) -> None:
    slot = self.state_slots.allocate(request_id)
    self.requests.state_slot[row] = slot
    gen = torch.Generator().manual_seed(slot)
    for state in self.caches.conv + self.caches.ssm:
        state[slot] = torch.randn(state.shape[1:], generator=gen)


def test_freed_slot_reused_gives_the_same_tokens_as_alone(folder):
    _, path = folder
    first, second = random_prompts([7, 9], seed=3).values()
    player = PlanPlayer(make_runner(path, num_state_slots=1), token_budget=5)
    player.add("a", first, greedy(4))
    player.run()
    assert player.runner.state_slots.num_in_use == 1, "a's slot is held until finished_ids"
    player.add("b", second, greedy())  # b's first plan carries finished_ids=["a"]
    reused = player.run()["b"]
    flush(player)

    alone = PlanPlayer(make_runner(path, num_state_slots=1), token_budget=5)
    alone.add("b", second, greedy())
    assert reused == alone.run()["b"]


@pytest.mark.parametrize("preset", ["tiny-mamba", "tiny-jamba"])
def test_presets_run_with_random_weights(preset):
    runner = make_runner(preset, num_state_slots=4, dtype="bfloat16")  # the fast CPU dtype
    assert runner.dtype == torch.bfloat16
    assert all(s.dtype == torch.float32 for s in runner.caches.conv + runner.caches.ssm)
    player = PlanPlayer(runner, token_budget=8)
    for rid, prompt in random_prompts([5, 12, 1]).items():
        player.add(rid, prompt, greedy(6))
    outputs = player.run()
    assert all(len(t) == 6 and all(0 <= x < 1000 for x in t) for t in outputs.values())
    flush(player)
