"""Micro-benchmark of one ModelRunner decode step, and of what it spends outside the forward.

    python -m benchmarks.runner_step --model tiny-llama --batch 256 --json

`batch` requests with `prompt-len`-token prompts are prefilled first (not timed), then each of
`steps` decode steps runs all of them. forward = model forward + LM head; sampling = the
sampler; outside = step - forward (plan handling, input preparation, sampling, bookkeeping).
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

import worker_svc.runner as runner_module
from protocol.sampling import SamplingParams
from protocol.worker_messages import NewRequestData, RunningRequestData, StepPlan
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig


class _Timer:
    """Wraps a callable and sums its wall time (perf_counter) per step."""

    def __init__(self, fn):
        self.fn, self.total = fn, 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self.total += time.perf_counter() - start
        return out


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    block_size = 16
    num_blocks_per_req = -(-(args.prompt_len + args.steps + 1) // block_size)
    runner = ModelRunner(RunnerConfig(model=args.model, dtype=args.dtype, block_size=block_size,
                                      num_gpu_blocks=args.batch * num_blocks_per_req + 1))
    forward = runner.model.forward = _Timer(runner.model.forward)
    logits = runner.model.compute_logits = _Timer(runner.model.compute_logits)
    sampling = runner_module.sample = _Timer(runner_module.sample)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 1, ignore_eos=True)
    ids = [f"r{i}" for i in range(args.batch)]
    blocks = np.arange(1, args.batch * num_blocks_per_req + 1).reshape(args.batch, -1).tolist()
    prefill = StepPlan(step_id=0, finished_ids=[], preempted_ids=[], running_requests=[],
                       new_requests=[NewRequestData(
                           ids[i], rng.integers(4, runner.vocab_size, args.prompt_len).tolist(),
                           args.prompt_len, params, blocks[i], 0, args.prompt_len)
                           for i in range(args.batch)])
    assert runner.execute(prefill).error is None
    step_ms, forward_ms, sample_ms = [], [], []
    for step in range(1, args.steps + 1):
        plan = StepPlan(step_id=step, finished_ids=[], preempted_ids=[], new_requests=[],
                        running_requests=[RunningRequestData(i, [], 1) for i in ids])
        forward.total = logits.total = sampling.total = 0.0
        start = time.perf_counter()
        result = runner.execute(plan)
        step_ms.append((time.perf_counter() - start) * 1e3)
        assert result.error is None, result.error
        forward_ms.append((forward.total + logits.total) * 1e3)
        sample_ms.append(sampling.total * 1e3)
    skip = min(2, args.steps - 1)  # warm-up steps (first-call allocations) are not counted
    med = lambda xs: round(statistics.median(xs[skip:]), 3)  # noqa: E731
    return {
        "config": {"model": args.model, "dtype": runner.loaded.dtype_name, "batch": args.batch,
                   "prompt_len": args.prompt_len, "steps": args.steps,
                   "threads": torch.get_num_threads(), "device": str(runner.device),
                   "block_size": block_size, "torch": torch.__version__},
        "step_ms": med(step_ms), "forward_ms": med(forward_ms),
        "outside_ms": med([s - f for s, f in zip(step_ms, forward_ms)]),
        "sampling_ms": med(sample_ms),
        "decode_tokens_per_s": round(args.batch / (med(step_ms) / 1e3), 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 where the CPU has bf16 units, else float32")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0: torch default")
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args()
    report = run(args)
    print("config: " + " ".join(f"{k}={v}" for k, v in report["config"].items()))
    print(f"decode step (median): {report['step_ms']} ms = forward {report['forward_ms']} ms "
          f"+ outside {report['outside_ms']} ms (of which sampling {report['sampling_ms']} ms)")
    print(f"decode throughput: {report['decode_tokens_per_s']} tokens/s")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
