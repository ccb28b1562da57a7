"""Mamba model vs transformers on the same saved weights (float32), through hand-built batches.

The driver (tests/state_model_driver.py) mixes first prefill chunks, later chunks and decodes
in one batch, reuses freed state slots, and fills a newly taken slot with noise; the greedy
tokens must still equal transformers' generate(do_sample=False) token for token.
"""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.mamba_model_folders import make_mamba_folder
from tests.state_model_driver import StateModelDriver
from tests.state_model_helpers import MAX_NEW, hf_greedy, load_ours, random_prompts, run_mixed
from worker_svc.models.mamba import MambaForCausalLM
from worker_svc.models.state_layout import SeqGroup, StateLayout

PROMPT_LENS = [11, 6, 1, 9, 3, 7]
@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mamba_untied")
    # Untied head: with a tied one the random model mostly repeats its input token, which
    # would let a broken state go unnoticed.
    hf_model = make_mamba_folder(str(folder), tie_word_embeddings=False)
    return hf_model, folder


def test_greedy_matches_transformers_in_mixed_batches(untied):
    hf_model, folder = untied
    prompts = random_prompts(PROMPT_LENS)
    driver, ours = run_mixed(load_ours(folder), prompts)
    assert {"first_chunk", "later_chunk", "decode"} in driver.step_kinds, "no fully mixed step"
    assert driver.pool.num_in_use == 0
    for rid, prompt in prompts.items():
        assert ours[rid] == hf_greedy(hf_model, prompt, MAX_NEW), rid
    assert len({tuple(t) for t in ours.values()}) == len(prompts), "degenerate outputs"


def test_comparison_fails_when_state_is_not_carried(untied, monkeypatch):
    """The test above can fail: drop the carried state and the tokens diverge."""
    hf_model, folder = untied
    prompts = random_prompts(PROMPT_LENS[:3])
    monkeypatch.setattr(SeqGroup, "initial_state",
                        lambda self, state: torch.zeros_like(state[self.slots]))
    _, ours = run_mixed(load_ours(folder), prompts)
    assert any(ours[r] != hf_greedy(hf_model, p, MAX_NEW) for r, p in prompts.items())


def test_comparison_fails_when_a_fresh_sequence_trusts_its_slot(untied, monkeypatch):
    """The driver's noisy fresh slots are caught only if the model ignores them: prove it."""
    hf_model, folder = untied
    prompts = random_prompts(PROMPT_LENS[:3])
    monkeypatch.setattr(SeqGroup, "initial_state", lambda self, state: state[self.slots])
    _, ours = run_mixed(load_ours(folder), prompts)
    assert any(ours[r] != hf_greedy(hf_model, p, MAX_NEW) for r, p in prompts.items())


def test_logits_match_transformers_tied_head(tmp_path):
    """Chunked prefill (5 + 4 tokens) then a decode, logits close to transformers' forward."""
    hf_model = make_mamba_folder(str(tmp_path), seed=3)  # tied head, the Mamba default
    model = load_ours(tmp_path)
    tokens = random_prompts([10], seed=5)["r0"]
    with torch.no_grad():
        ref = hf_model(torch.tensor([tokens])).logits[0]  # [10, vocab]
    driver = StateModelDriver(model, num_slots=2)
    driver.add("a", tokens[:9])
    logits = []
    for num in (5, 4):
        step, _ = driver.build_batch([("a", num)])
        logits.append(model.compute_logits(driver.forward(step)))
    driver.seqs["a"].tokens.append(tokens[9])
    step, _ = driver.build_batch([("a", 1)])
    logits.append(model.compute_logits(driver.forward(step)))
    ours = torch.cat(logits)  # [10, vocab]: every hidden row, not only the sampled ones
    torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)


def test_layout_gives_decodes_their_own_single_step_group():
    """Decodes must not walk a long prefill's padded steps: one [G, 1] group for them."""
    query_lens, computed = np.array([1, 5, 1, 3]), np.array([7, 0, 2, 4])
    decode, prefill = StateLayout.build(query_lens, computed, np.array([3, 0, 2, 1]),
                                        torch.device("cpu")).groups
    assert decode.token_index.tolist() == [[0], [6]] and decode.slots.tolist() == [3, 2]
    assert decode.has_state.tolist() == [True, True]
    assert prefill.token_index.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0]]
    assert prefill.valid.tolist() == [[True] * 5, [True] * 3 + [False] * 2]
    assert prefill.packed_index.tolist() == [1, 2, 3, 4, 5, 7, 8, 9]
    assert prefill.slots.tolist() == [0, 1] and prefill.has_state.tolist() == [False, True]


def test_cache_spec_and_missing_weights(untied):
    _, folder = untied
    model = load_ours(folder)
    assert isinstance(model, MambaForCausalLM)
    spec = model.cache_spec()
    assert (spec.num_attention_layers, spec.num_state_layers) == (0, 3)
    assert spec.conv_state_shape == (128, 4) and spec.ssm_state_shape == (128, 16)
    weights = load_file(str(folder / "model.safetensors"))
    del weights["backbone.layers.1.mixer.A_log"]
    with pytest.raises(KeyError, match="A_log"):
        load_ours_from(model.config, weights)


def load_ours_from(config, weights):
    model = MambaForCausalLM(config, torch.float32)
    model.load_weights(weights.items())
    return model
