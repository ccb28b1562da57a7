"""A preset's shape saved as a Hugging Face folder (random weights, the byte tokenizer), so a
peer engine can load the same model as `stepserve bench throughput --model PRESET` runs:

    python -m benchmarks.preset_folder --model tiny-qwen3 --out /tmp/models/tiny-qwen3
    python -m benchmarks.peers --case /tmp/models/tiny-qwen3:float32:2000 ...

The weights are transformers' random init, not the preset's seeded ones: their values do not
change the speed.
"""
import argparse
import json
import os

import torch

from benchmarks.hf_generate import build_hf_model
from worker_svc import presets
from worker_svc.byte_tokenizer import build_byte_tokenizer, byte_tokenizer_json


def save_preset(name: str, out: str) -> str:
    if presets.preset_pooling(name):
        return save_encoder_preset(name, out)
    config = presets.preset_config(name)
    model = build_hf_model(name, torch.float32)
    model.generation_config.eos_token_id = config["eos_token_id"]
    model.save_pretrained(out)
    specials = presets.preset_specials(config)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        f.write(byte_tokenizer_json(config["vocab_size"], specials))
    names = {token_id: token for token, token_id in specials.items()}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:  # what AutoTokenizer needs besides
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": names[config["bos_token_id"]],
                   "eos_token": names[config["eos_token_id"]], "pad_token": names[config["pad_token_id"]],
                   "model_max_length": config["max_position_embeddings"]}, f)
    return out


def save_encoder_preset(name: str, out: str) -> str:
    """An encoder preset (all-minilm-l6-v2, bge-small) as its hub repository holds it: the
    transformers folder, the byte tokenizer with BERT's [CLS] ... [SEP] around each text, and
    sentence-transformers' modules.json, 1_Pooling/config.json and Normalize module as the
    repository's are (their older spelling), so sentence-transformers loads the folder too."""
    from tokenizers import processors
    from transformers import AutoConfig, AutoModel
    config = presets.preset_config(name)
    hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
    AutoModel.from_config(hf_config, dtype=torch.float32).eval().save_pretrained(out)
    specials = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    tokenizer = build_byte_tokenizer(config["vocab_size"], specials)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    pooling_type, normalize = presets.preset_pooling(name)
    files = {
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]",
                                  "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                                  "mask_token": "[MASK]", "model_max_length": 512},
        "modules.json": [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        + ([{"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
           if normalize else []),
        "sentence_bert_config.json": {"max_seq_length": 512, "do_lower_case": False},
        "1_Pooling/config.json": {"word_embedding_dimension": config["hidden_size"],
                                  "pooling_mode_cls_token": pooling_type == "CLS",
                                  "pooling_mode_mean_tokens": pooling_type == "MEAN",
                                  "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False},
    }
    for path, content in files.items():
        os.makedirs(os.path.dirname(os.path.join(out, path)), exist_ok=True)
        with open(os.path.join(out, path), "w") as f:
            json.dump(content, f, indent=2)
    if normalize:
        os.makedirs(os.path.join(out, "2_Normalize"), exist_ok=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.preset_folder", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=sorted(presets.PRESETS))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    print(save_preset(args.model, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
