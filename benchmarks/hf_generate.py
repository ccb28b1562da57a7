"""Hugging Face `generate` on the same preset shape and the same random prompts as
`stepserve bench throughput`, for the side-by-side figure.

    python -m benchmarks.hf_generate --model tiny-llama --num-prompts 1000 --batch-size 256 --json

Workload as the peers' script: fixed batches, exactly --output-len new tokens (EOS never
stops a row), greedy, generation timed after a small warm-up. The weights are random; their
values do not change the speed.
"""
import argparse
import json
import sys
import time

import torch

from stepserve.bench.throughput import random_prompts
from worker_svc import presets


def build_hf_model(name_or_folder: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM
    if presets.is_preset(name_or_folder):
        config = presets.preset_config(name_or_folder)
        hf_config = AutoConfig.for_model(config.pop("model_type"), **config)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(name_or_folder, dtype=dtype)
    model.generation_config.eos_token_id = None
    return model.eval()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hf_generate")
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--input-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    model = build_hf_model(args.model, getattr(torch, args.dtype))
    prompts = torch.tensor(random_prompts(args.num_prompts, args.input_len, model.config.vocab_size,
                                          args.seed, {0, 1, 2, 3}))

    @torch.inference_mode()
    def run(ids: torch.Tensor) -> int:
        num_out = 0
        for start in range(0, len(ids), args.batch_size):
            batch = ids[start:start + args.batch_size]
            out = model.generate(batch, attention_mask=torch.ones_like(batch), do_sample=False,
                                 max_new_tokens=args.output_len, pad_token_id=0)
            num_out += (out.shape[1] - batch.shape[1]) * batch.shape[0]
        return num_out

    run(prompts[:8])
    start = time.perf_counter()
    num_output_tokens = run(prompts)
    elapsed = time.perf_counter() - start
    result = {
        "engine": "hf-transformers-generate", "model": args.model, "dtype": args.dtype,
        "batch_size": args.batch_size, "num_prompts": args.num_prompts, "input_len": args.input_len,
        "output_len": args.output_len, "threads": torch.get_num_threads(), "elapsed_s": round(elapsed, 3),
        "requests_per_second": round(args.num_prompts / elapsed, 2),
        "tokens_per_second": round((num_output_tokens + prompts.numel()) / elapsed, 2),
        "output_tokens_per_second": round(num_output_tokens / elapsed, 2),
    }
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, {result['tokens_per_second']:.2f} total "
          f"tokens/s, {result['output_tokens_per_second']:.2f} output tokens/s")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
