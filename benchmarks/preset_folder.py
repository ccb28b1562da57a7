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
from worker_svc.byte_tokenizer import byte_tokenizer_json


def save_preset(name: str, out: str) -> str:
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.preset_folder", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=sorted(presets.PRESETS))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    print(save_preset(args.model, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
