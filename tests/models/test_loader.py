"""Loader: presets and their byte tokenizer, seeded dummy weights, folders, dtypes."""
import json

import pytest
import torch
from tokenizers import Tokenizer

from tests.hf_model_folders import make_llama_folder, resharded
from worker_svc.byte_tokenizer import byte_tokenizer_json
from worker_svc.loader import load_model
from worker_svc.presets import PRESETS


def _weights(loaded) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in loaded.model.named_parameters()}


def test_preset_shapes():
    llama = PRESETS["tiny-llama"]
    assert (llama["vocab_size"], llama["hidden_size"], llama["intermediate_size"],
            llama["num_hidden_layers"], llama["num_attention_heads"],
            llama["num_key_value_heads"], llama["max_position_embeddings"]) == (
        32000, 256, 688, 4, 4, 4, 2048)
    opt = PRESETS["opt-125m"]
    assert (opt["vocab_size"], opt["hidden_size"], opt["num_hidden_layers"],
            opt["num_attention_heads"], opt["ffn_dim"]) == (50272, 768, 12, 12, 3072)
    micro = PRESETS["micro-llama"]
    assert (micro["vocab_size"], micro["hidden_size"], micro["intermediate_size"],
            micro["num_hidden_layers"], micro["num_attention_heads"]) == (1000, 128, 256, 2, 2)
    assert "tiny-opt" in PRESETS


@pytest.mark.parametrize("name", ["micro-llama", "tiny-opt"])
def test_preset_weights_are_seeded(name):
    first, again = _weights(load_model(name)), _weights(load_model(name))
    other_seed = _weights(load_model(name, seed=1))
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert not torch.equal(first["layers.0.self_attn.qkv_proj.weight"],
                           other_seed["layers.0.self_attn.qkv_proj.weight"])


@pytest.mark.parametrize("name", ["micro-llama", "tiny-opt"])
def test_preset_tokenizer_matches_the_config(name):
    loaded = load_model(name)
    tokenizer = Tokenizer.from_str(loaded.tokenizer_json)
    config = loaded.config
    assert tokenizer.get_vocab_size() == config["vocab_size"]
    assert tokenizer.id_to_token(config["eos_token_id"]) == "</s>"
    assert tokenizer.id_to_token(config["bos_token_id"]) in ("<s>", "</s>")
    assert loaded.eos_token_ids == [config["eos_token_id"]]
    text = "stepserve: 16 in / 16 out, ça va?"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    every_id = list(range(config["vocab_size"]))
    assert len(tokenizer.decode(every_id, skip_special_tokens=False)) > 0
    assert all(tokenizer.id_to_token(i) is not None for i in every_id)


def test_dtype_choice():
    assert load_model("micro-llama", dtype="bfloat16").dtype == torch.bfloat16
    assert load_model("micro-llama", dtype="float16").model.embed_tokens.weight.dtype == torch.float16
    assert load_model("micro-llama", dtype="auto").dtype in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError):
        load_model("micro-llama", dtype="float64")
    with pytest.raises(ValueError):
        load_model("no-such-model-or-folder")


def test_folder_loads_its_weights_dtype_and_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM
    folder = make_llama_folder(str(tmp_path / "m"))
    loaded = load_model(folder)
    assert loaded.dtype == torch.float32  # config.json's dtype
    hf = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    ours = loaded.model.layers[1].self_attn.qkv_proj.weight
    q_size = hf["model.layers.1.self_attn.q_proj.weight"].shape[0]
    assert torch.equal(ours[:q_size], hf["model.layers.1.self_attn.q_proj.weight"])
    assert torch.equal(ours[-q_size:], hf["model.layers.1.self_attn.v_proj.weight"])
    assert loaded.tokenizer_json == byte_tokenizer_json(1000)
    dummy = load_model(folder, load_format="dummy")
    assert not torch.equal(dummy.model.layers[1].self_attn.qkv_proj.weight, ours)


def test_a_checkpoint_missing_a_weight_fails_loudly(tmp_path):
    from safetensors.torch import load_file, save_file
    folder = make_llama_folder(str(tmp_path / "m"))
    path = tmp_path / "m" / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="k_proj|qkv_proj"):
        load_model(folder)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]


def test_a_sharded_checkpoint_loads_the_shards_its_index_names(tmp_path):
    from safetensors.torch import save_file
    folder = make_llama_folder(str(tmp_path / "m"))
    sharded = resharded(folder, str(tmp_path / "sharded"), max_shard_size="100KB")
    shards = [p.name for p in (tmp_path / "sharded").glob("*.safetensors")]
    assert len(shards) > 2 and (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    # The same weights consolidated under other names, as some repositories keep them too: not loaded.
    save_file({"layers.0.attention.wq.weight": torch.zeros(2, 2)}, f"{sharded}/consolidated.safetensors")
    whole, from_shards = load_model(folder), load_model(sharded, name="test-org/tiny-model")
    assert from_shards.name == "test-org/tiny-model"
    expected, loaded = _weights(whole), _weights(from_shards)
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[n], expected[n]) for n in expected)
