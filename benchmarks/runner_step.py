"""Micro-benchmark of one ModelRunner decode step, eager and compiled side by side.

    python -m benchmarks.runner_step --model tiny-llama --batch 256 --prompt-len 24 --json
    python -m benchmarks.runner_step --model opt-125m --device cuda --modes eager,compiled,graphs

Modes: eager (--enforce-eager), compiled (without CUDA graphs), graphs (compiled, and on CUDA
the decode step replays a CUDA graph: the report says how many steps did). On CUDA each timed
part ends with a synchronisation, so the parts add up to device time, not launch time.

`batch` requests with `prompt-len`-token prompts are prefilled (not timed); then the modes take
turns, one decode step of all the requests each, for `steps` rounds (A B A B, so a noisy host
hurts both alike), and the medians are reported per mode: the whole step, and its parts:
prepare (input and attention-metadata preparation), forward (the model; for an all-greedy batch
also its LM head and argmax, which run in the forward's graph when compiled), sampling (LM head
and sampler of the other batches) and other (plan handling, sampling metadata, bookkeeping).
The runner picks its thread count as a worker does (worker_svc/cpu_threads.py) unless --threads.
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

from protocol.sampling import SamplingParams
from protocol.worker_messages import NewRequestData, RunningRequestData, StepPlan
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig

PARTS = ("prepare", "forward", "sampling")


class _Timed:
    """Wraps a bound method and sums its wall time into totals[part] (on CUDA, until the
    device has done what it queued)."""

    def __init__(self, fn, totals: dict, part: str, device: torch.device):
        self.fn, self.totals, self.part = fn, totals, part
        self.sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self.sync()
        self.totals[self.part] += time.perf_counter() - start
        return out


class _Mode:
    """One runner and its requests, prefilled, with its parts timed."""

    def __init__(self, args, mode: str):
        block_size = 16
        blocks_per_request = -(-(args.prompt_len + args.steps + 1) // block_size)
        self.runner = ModelRunner(RunnerConfig(
            model=args.model, dtype=args.dtype, block_size=block_size,
            num_gpu_blocks=args.batch * blocks_per_request, enforce_eager=mode == "eager",
            max_cudagraph_capture_size=args.batch if mode == "graphs" else 0, device=args.device,
            compile_cache_dir=args.compile_cache_dir, threads=args.threads or None))
        self.totals = dict.fromkeys(PARTS, 0.0)
        runner = self.runner
        device = runner.device
        runner._prepare = _Timed(runner._prepare, self.totals, "prepare", device)
        runner.executor.forward = _Timed(runner.executor.forward, self.totals, "forward", device)
        runner._sample = _Timed(runner._sample, self.totals, "sampling", device)
        self.ids = [f"r{i}" for i in range(args.batch)]
        rng = np.random.default_rng(0)
        params = SamplingParams(temperature=args.temperature, max_tokens=args.steps + 1, ignore_eos=True)
        blocks = np.arange(args.batch * blocks_per_request).reshape(args.batch, -1).tolist()
        prefill = StepPlan(step_id=0, finished_ids=[], preempted_ids=[], running_requests=[],
                           new_requests=[NewRequestData(
                               self.ids[i], rng.integers(4, runner.vocab_size, args.prompt_len).tolist(),
                               args.prompt_len, params, blocks[i], 0, args.prompt_len)
                               for i in range(args.batch)])
        assert runner.execute(prefill).error is None
        self.samples: dict[str, list[float]] = {k: [] for k in ("step", *PARTS, "other")}

    def step(self, step_id: int) -> None:
        plan = StepPlan(step_id=step_id, finished_ids=[], preempted_ids=[], new_requests=[],
                        running_requests=[RunningRequestData(i, [], 1) for i in self.ids])
        for part in PARTS:
            self.totals[part] = 0.0
        start = time.perf_counter()
        result = self.runner.execute(plan)
        elapsed = time.perf_counter() - start
        assert result.error is None, result.error
        self.samples["step"].append(elapsed * 1e3)
        for part in PARTS:
            self.samples[part].append(self.totals[part] * 1e3)
        self.samples["other"].append((elapsed - sum(self.totals.values())) * 1e3)

    def report(self, skip: int) -> dict:
        med = {k: round(statistics.median(v[skip:]), 3) for k, v in self.samples.items()}
        med["decode_tokens_per_s"] = round(len(self.ids) / (med["step"] / 1e3), 1)
        med["warm_up_s"] = round(self.runner.warm_up_s, 1)
        graphs = self.runner.executor.decode_graphs
        med["graph_replays"] = graphs.num_replays if graphs is not None else 0
        return med


def run(args) -> dict:
    modes = {name: _Mode(args, name) for name in args.modes.split(",")}
    for step in range(1, args.steps + 1):
        for mode in modes.values():
            mode.step(step)
    skip = min(2, args.steps - 1)  # first-call allocations are not counted
    some = next(iter(modes.values())).runner
    return {
        "config": {"model": args.model, "dtype": some.loaded.dtype_name, "batch": args.batch,
                   "prompt_len": args.prompt_len, "steps": args.steps,
                   "threads": torch.get_num_threads(), "device": str(some.device),
                   "torch": torch.__version__},
        **{name: mode.report(skip) for name, mode in modes.items()},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--dtype", default="auto", help="auto: bfloat16 where the CPU has bf16 units, else float32")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--modes", default="eager,compiled", help="comma-separated: eager, compiled, graphs")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads; 0: the worker's choice (worker_svc/cpu_threads.py)")
    parser.add_argument("--compile-cache-dir", default=None)
    parser.add_argument("--json", action="store_true", help="also print one JSON line")
    args = parser.parse_args()
    report = run(args)
    print("config: " + " ".join(f"{k}={v}" for k, v in report["config"].items()))
    for name in args.modes.split(","):
        r = report[name]
        print(f"{name:>8}: step {r['step']} ms = prepare {r['prepare']} + forward {r['forward']} "
              f"+ sampling {r['sampling']} + other {r['other']}  ({r['decode_tokens_per_s']} tokens/s, "
              f"warm-up {r['warm_up_s']} s, {r['graph_replays']} graph replays)")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
