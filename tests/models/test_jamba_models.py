"""Jamba (attention + Mamba + MoE) vs transformers on the same saved weights (float32).

Same driver as the Mamba tests: mixed prefill / chunked prefill / decode batches, reused and
noise-filled state slots, and paged KV for the attention layers.
"""
import pytest
import torch
from safetensors.torch import load_file

from tests.mamba_model_folders import make_jamba_folder
from tests.state_model_driver import StateModelDriver
from tests.state_model_helpers import MAX_NEW, hf_greedy, load_ours, random_prompts, run_mixed
from worker_svc.models.jamba import JambaForCausalLM
from worker_svc.models.gated_mlp import GatedMLP
from worker_svc.models.sparse_moe import SparseMoe


@pytest.fixture(scope="module")
def moe_jamba(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jamba_moe")
    return make_jamba_folder(str(folder)), folder


def test_layer_plan_and_cache_spec(moe_jamba):
    _, folder = moe_jamba
    model = load_ours(folder)
    assert isinstance(model, JambaForCausalLM)
    # period 2: attention on odd layers, MoE on even layers (the Mamba ones) in this config
    assert [l.is_attention for l in model.layers] == [False, True, False, True]
    assert [type(l.feed_forward) for l in model.layers] == [SparseMoe, GatedMLP] * 2
    assert model.cache_index == [0, 0, 1, 1]
    spec = model.cache_spec()
    assert (spec.num_attention_layers, spec.num_kv_heads, spec.head_dim) == (2, 2, 16)
    assert spec.num_state_layers == 2
    assert spec.conv_state_shape == (128, 4) and spec.ssm_state_shape == (128, 8)


def test_greedy_matches_transformers_in_mixed_batches(moe_jamba):
    hf_model, folder = moe_jamba
    prompts = random_prompts([11, 6, 1, 9, 3, 7], seed=2)
    driver, ours = run_mixed(load_ours(folder), prompts)
    assert {"first_chunk", "later_chunk", "decode"} in driver.step_kinds, "no fully mixed step"
    for rid, prompt in prompts.items():
        assert ours[rid] == hf_greedy(hf_model, prompt, MAX_NEW), rid
    assert len({tuple(t) for t in ours.values()}) == len(prompts), "degenerate outputs"


def test_fused_expert_weights_load_like_per_expert_ones(moe_jamba):
    """transformers 5 keeps experts fused in memory (experts.gate_up_proj); both layouts load."""
    hf_model, folder = moe_jamba
    from_folder = load_ours(folder)  # per-expert names, as save_pretrained writes them
    fused = {k: v for k, v in hf_model.state_dict().items()}
    assert "model.layers.0.feed_forward.experts.gate_up_proj" in fused
    from_memory = JambaForCausalLM(from_folder.config, torch.float32)
    from_memory.load_weights(fused.items())
    for (name, a), (_, b) in zip(from_folder.named_parameters(), from_memory.named_parameters()):
        assert torch.equal(a, b), name


def test_missing_expert_weight_is_an_error(moe_jamba):
    _, folder = moe_jamba
    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.layers.2.feed_forward.experts.3.up_proj.weight"]
    model = JambaForCausalLM(load_ours(folder).config, torch.float32)
    with pytest.raises(KeyError, match="experts.3.up_proj"):
        model.load_weights(weights.items())


def test_dense_variant_logits_match_transformers(tmp_path):
    """num_experts=1 (no MoE), attention first (offset 0 of period 3), a tied head; chunked
    prefill of two sequences side by side, then a decode step, vs transformers' forward."""
    hf_model = make_jamba_folder(str(tmp_path), seed=4, num_experts=1, num_hidden_layers=3,
                                 attn_layer_period=3, attn_layer_offset=0,
                                 tie_word_embeddings=True)
    model = load_ours(tmp_path)
    assert [l.is_attention for l in model.layers] == [True, False, False]
    prompts = random_prompts([9, 6], seed=6)
    driver = StateModelDriver(model, num_slots=2)
    for rid, tokens in prompts.items():
        driver.add(rid, tokens[:-1])  # the last token goes in as a decode step
    rows = {"r0": [], "r1": []}
    for schedule in ([("r0", 5), ("r1", 3)], [("r0", 3), ("r1", 2)]):
        step, _ = driver.build_batch(schedule)
        logits = model.compute_logits(driver.forward(step))  # [T, vocab]
        for i, (rid, _) in enumerate(schedule):
            rows[rid].append(logits[step.spans[i]])
    for rid, tokens in prompts.items():
        driver.seqs[rid].tokens.append(tokens[-1])
    step, _ = driver.build_batch([("r1", 1), ("r0", 1)])
    logits = model.compute_logits(driver.forward(step))
    rows["r1"].append(logits[step.spans[0]])
    rows["r0"].append(logits[step.spans[1]])
    for rid, tokens in prompts.items():
        with torch.no_grad():
            ref = hf_model(torch.tensor([tokens])).logits[0]  # [len, vocab]
        torch.testing.assert_close(torch.cat(rows[rid]), ref, atol=2e-4, rtol=1e-4)
