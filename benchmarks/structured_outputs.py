"""Structured outputs against unconstrained decoding: one ModelRunner decode step at batch 256.

    flock /tmp/stepserve-bench.lock python -m benchmarks.structured_outputs --model tiny-llama --json

Two runners on the same model, one whose `batch` requests all follow one JSON schema (an array
of at least 64 bounded integers, so no request completes its grammar within the steps), one
unconstrained (greedy, the fused LM head + argmax path). Both are prefilled untimed (the
structured one's grammar compiles then); then they take turns, one decode step of every request
each (A B A B: a noisy host hurts both alike), and the medians are reported: the whole step,
and for the structured runner its split: mask (the step's matchers found and their bitmask fill
started), wait (the sampler waiting for the fill, which runs on its own thread during the
forward), apply (xgrammar writing the bitmask into the logits: the torch path only; on CPU the
sampling kernel reads the bitmask with the logits, inside rest), rest (everything else: the forward, the LM head as full
logits, the sampler, bookkeeping). unconstrained_hooks_us: what a step of unconstrained rows
pays for the new per-request sampler state (the hooks alone, timed in a loop). --compare-engines also times xgrammar and llguidance on this
model's tokenizer: the schema's compilation and one mask fill of `batch` matchers.
--temperature T samples both runners' requests at T (default 0: greedy, where the unconstrained
runner takes the fused LM head + argmax).
"""
import argparse
import json
import statistics
import time

import numpy as np

from benchmarks.cpu_info import cpu_summary
from protocol.sampling import SamplingParams, StructuredOutputsParams
from protocol.worker_messages import NewRequestData, RunningRequestData, StepPlan
from worker_svc import structured_outputs
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig

SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 64}


class _Timer:
    def __init__(self):
        self.totals = {"mask": 0.0, "wait": 0.0, "apply": 0.0}

    def wrap(self, fn, part: str):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[part] += time.perf_counter() - start
        return timed


class _Mode:
    def __init__(self, args, structured: bool, timer: _Timer):
        block_size = 16
        blocks_per_request = -(-(args.prompt_len + args.steps + 2) // block_size)
        self.runner = runner = ModelRunner(RunnerConfig(
            model=args.model, dtype=args.dtype, block_size=block_size, enforce_eager=args.enforce_eager,
            num_gpu_blocks=args.batch * blocks_per_request))
        self.structured, self.timer = structured, timer
        if structured:
            outputs = runner.requests.structured_outputs
            outputs.for_step = timer.wrap(outputs.for_step, "mask")
        self.ids = [f"r{i}" for i in range(args.batch)]
        rng = np.random.default_rng(0)
        params = SamplingParams(temperature=args.temperature, max_tokens=args.steps + 2, ignore_eos=True,
                                structured_outputs=StructuredOutputsParams(json=SCHEMA) if structured else None)
        blocks = np.arange(args.batch * blocks_per_request).reshape(args.batch, -1).tolist()
        prefill = StepPlan(step_id=0, finished_ids=[], preempted_ids=[], running_requests=[], new_requests=[
            NewRequestData(self.ids[i], rng.integers(4, 200, args.prompt_len).tolist(), args.prompt_len, params,
                           blocks[i], 0, args.prompt_len) for i in range(args.batch)])
        result = runner.execute(prefill)
        assert result.error is None and not result.request_errors, result
        self.samples: dict[str, list[float]] = {k: [] for k in ("step", "mask", "wait", "apply", "rest")}

    def step(self, step_id: int) -> None:
        plan = StepPlan(step_id=step_id, finished_ids=[], preempted_ids=[], new_requests=[],
                        running_requests=[RunningRequestData(i, [], 1) for i in self.ids])
        self.timer.totals.update(mask=0.0, wait=0.0, apply=0.0)
        start = time.perf_counter()
        result = self.runner.execute(plan)
        elapsed = (time.perf_counter() - start) * 1e3
        assert result.error is None and min(result.sampled_token_ids) >= 0, result.error
        mask, wait, apply = (self.timer.totals[k] * 1e3 for k in ("mask", "wait", "apply"))
        for key, value in (("step", elapsed), ("mask", mask), ("wait", wait), ("apply", apply),
                           ("rest", elapsed - mask - wait - apply)):
            self.samples[key].append(value)


def unconstrained_hooks_us(runner: ModelRunner, num_rows: int) -> float:
    """What a step of unconstrained rows pays for the sampler's per-request state (penalties,
    bias, grammars, prompt logprobs): the hooks the step calls, in microseconds per step."""
    table = runner.requests
    rows = np.array(list(table.row_of.values())[:num_rows])
    tokens = np.zeros(len(rows), dtype=np.int64)
    query_lens = np.ones(len(rows), dtype=np.int64)
    num_calls = 2000
    start = time.perf_counter()
    for _ in range(num_calls):
        table.logits_processors.for_step(rows, table.generated_token_ids)
        table.structured_outputs.for_step(rows)
        table.logits_processors.on_sampled(rows, tokens)
        table.structured_outputs.on_sampled(rows, tokens)
        runner._score_prompts(None, rows, query_lens, np.arange(len(rows)))
    return (time.perf_counter() - start) / num_calls * 1e6


def compare_engines(runner: ModelRunner, batch: int) -> dict:
    """Compilation of SCHEMA and one bitmask fill of `batch` fresh matchers (after '[1,'), per engine."""
    import llguidance
    import llguidance.hf
    import llguidance.torch
    import xgrammar
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer_json, vocab_size = runner.loaded.tokenizer_json, runner.vocab_size
    prefix = Tokenizer.from_str(tokenizer_json).encode("[1,", add_special_tokens=False).ids
    out = {}
    start = time.perf_counter()
    compiler = structured_outputs.grammar_compiler(tokenizer_json, vocab_size, runner.loaded.eos_token_ids)
    grammar = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    compile_s = time.perf_counter() - start
    matchers = [xgrammar.GrammarMatcher(grammar) for _ in range(batch)]
    for m in matchers:
        for t in prefix:
            m.accept_token(t)
    bitmask = xgrammar.allocate_token_bitmask(batch, vocab_size)
    start = time.perf_counter()
    xgrammar.BatchGrammarMatcher().batch_fill_next_token_bitmask(matchers, bitmask)
    out["xgrammar"] = {"compile_s_with_tokenizer_info": compile_s, "fill_ms": (time.perf_counter() - start) * 1e3}

    start = time.perf_counter()
    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json))
    hf.eos_token_id = runner.loaded.eos_token_ids[0]
    ll_tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults={"whitespace_flexible": False})
    matchers = [llguidance.LLMatcher(ll_tokenizer, grammar) for _ in range(batch)]
    compile_s = time.perf_counter() - start
    for m in matchers:
        m.consume_tokens(prefix)
    bitmask = llguidance.torch.allocate_token_bitmask(batch, vocab_size)
    executor = llguidance.LLExecutor()
    start = time.perf_counter()
    llguidance.torch.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
    fill_ms = (time.perf_counter() - start) * 1e3
    out["llguidance"] = {"compile_s_with_tokenizer_info": compile_s, "fill_ms": fill_ms}
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--compare-engines", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    timer = _Timer()
    from worker_svc.structured_outputs import StepGrammar
    StepGrammar.wait = timer.wrap(StepGrammar.wait, "wait")
    StepGrammar.apply = timer.wrap(StepGrammar.apply, "apply")
    modes = {"unconstrained": _Mode(args, False, timer), "structured": _Mode(args, True, timer)}
    for step_id in range(1, args.steps + 1):
        for mode in modes.values():
            mode.step(step_id)
    medians = {name: {k: round(statistics.median(v), 3) for k, v in mode.samples.items()}
               for name, mode in modes.items()}
    report = {"benchmark": "structured_outputs", "model": args.model, "dtype": args.dtype, "batch": args.batch,
              "temperature": args.temperature, "steps": args.steps,
              "compiled": modes["unconstrained"].runner.executor.compiled, "cpu": cpu_summary(),
              "step_ms": medians,
              "slowdown": round(medians["structured"]["step"] / medians["unconstrained"]["step"], 3),
              "unconstrained_hooks_us": round(unconstrained_hooks_us(modes["unconstrained"].runner, args.batch), 2)}
    if args.compare_engines:
        report["engines"] = compare_engines(modes["structured"].runner, args.batch)
    if args.json:
        print(json.dumps(report))
    else:
        for name, values in medians.items():
            print(f"{name:>14}: " + "  ".join(f"{k} {v:.2f} ms" for k, v in values.items()))
        print(f"slowdown {report['slowdown']}x; unconstrained rows' hooks {report['unconstrained_hooks_us']} us/step "
              f"({report['cpu']})")
        if "engines" in report:
            print(report["engines"])


if __name__ == "__main__":
    main()
