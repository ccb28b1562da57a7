"""The rotary embedding (worker_svc/models/rotary.py) gives transformers' cos/sin for every rope
type, for each token of a sequence generated the way transformers generates it: the prompt in
one forward, then one forward per new token, on a fresh rotary module (its dynamic state)."""
import pytest
import torch

from worker_svc.forward_context import ForwardContext, forward_context
from worker_svc.models.rotary import RotaryEmbedding, max_model_len, rope_parameters, rotary_from_config

HEAD_DIM = 16
PROMPT_LEN, NUM_NEW = 20, 20  # 40 positions: past every original length below (16, 24)
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 500.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 3.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
                 "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
                 "long_factor": [1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0]},
}


def _hf_rotary(config):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
    return (Phi3RotaryEmbedding if config.model_type == "phi3" else LlamaRotaryEmbedding)(config)


def _hf_generation_cos_sin(config, prompt_len: int, num_new: int):
    """cos, sin [prompt_len + num_new, rotary_dim] as transformers' generate computes them."""
    rotary, x = _hf_rotary(config), torch.zeros(1, dtype=torch.float32)
    forwards = [torch.arange(prompt_len)[None]] + [torch.tensor([[p]]) for p in range(prompt_len, prompt_len + num_new)]
    outs = [rotary(x, position_ids) for position_ids in forwards]
    return torch.cat([c[0] for c, _ in outs]), torch.cat([s[0] for _, s in outs])


def _ours(config_dict: dict, prompt_len: int, num_new: int):
    # Tables of 64 positions whatever max_model_len says: every type is compared up to 40.
    rotary = RotaryEmbedding(rope_parameters(config_dict), HEAD_DIM, 64, torch.float32,
                             config_max_position_embeddings=config_dict["max_position_embeddings"])
    positions = torch.arange(prompt_len + num_new)
    lengths = torch.maximum(torch.full_like(positions, prompt_len), positions + 1)
    with forward_context(ForwardContext(rope_lengths=lengths)):
        return rotary.cos_sin(positions)


@pytest.mark.parametrize("rope_type", list(ROPES))
def test_llama_rope_types_equal_transformers(rope_type):
    from transformers import LlamaConfig
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=24,
                         rope_parameters=dict(ROPES[rope_type]))
    config_dict = config.to_dict()
    assert max_model_len(config_dict) == {"linear": 60, "dynamic": 72, "yarn": 64}.get(rope_type, 24)
    hf_cos, hf_sin = _hf_generation_cos_sin(config, PROMPT_LEN, NUM_NEW)
    cos, sin = _ours(config_dict, PROMPT_LEN, NUM_NEW)
    torch.testing.assert_close(cos, hf_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin, rtol=0, atol=1e-6)
    if rope_type != "default":  # the scaling changes positions inside this test's lengths
        plain = rotary_from_config({"max_position_embeddings": 64}, HEAD_DIM, torch.float32).cos[:40]
        assert not torch.allclose(cos, plain)


def test_phi3_partial_longrope_from_an_old_folder_equals_transformers():
    """Phi-3 keeps original_max_position_embeddings and partial_rotary_factor at the top level,
    older folders say rope_scaling and "type"."""
    from transformers import Phi3Config
    old_style = {"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [2.0, 3.0, 5.0, 9.0]}
    config = Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=64,
                        original_max_position_embeddings=16, partial_rotary_factor=0.5,
                        rope_scaling=dict(old_style))
    config_dict = {"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4,
                   "max_position_embeddings": 64, "original_max_position_embeddings": 16,
                   "partial_rotary_factor": 0.5, "rope_scaling": old_style}
    assert rope_parameters(config_dict)["rope_type"] == "longrope"
    for prompt_len in (10, 20):  # a short prompt that grows past 16, a long one
        hf_cos, hf_sin = _hf_generation_cos_sin(config, prompt_len, 0)
        cos, sin = _ours(config_dict, prompt_len, 0)
        assert cos.shape == (prompt_len, HEAD_DIM // 2)
        torch.testing.assert_close((cos, sin), (hf_cos, hf_sin), rtol=0, atol=1e-6)


def test_an_unknown_rope_type_is_refused_by_name():
    with pytest.raises(NotImplementedError, match="'mrope'.*supported"):
        rope_parameters({"rope_parameters": {"rope_type": "mrope"}})
