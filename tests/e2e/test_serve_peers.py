"""benchmarks/serve_peers.py end to end at a tiny size with stepserve only (vLLM is not in CI): a
real `stepserve serve` started and stopped by the script, `stepserve bench serve` as its client,
every run's figures and CPU seconds, and the summary's JSON."""
import json
import os
import subprocess
import sys

from tests.cli_helpers import pids

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_serve_peers_measures_stepserve_serve_and_stops_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.serve_peers", "--model", "micro-llama", "--dtype", "float32",
         "--stepserve-arg=--enforce-eager", "--stepserve-arg=--kv-cache-gb=0.05", "--served-model-name", "tiny",
         "--case", "1:3", "--case", "4:12", "--input-len", "8", "--output-len", "4", "--rounds", "1",
         "--log-dir", str(tmp_path), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cpu: ") and " cores, flags: " in lines[0]
    runs = [json.loads(line) for line in lines if line.startswith('{"round"')]
    assert [(r["concurrency"], r["sampling"]) for r in runs] == [
        (1, "default"), (1, "greedy"), (4, "default"), (4, "greedy")]
    for run in runs:
        assert (run["engine"], run["completed"], run["failed"]) == ("stepserve", run["num_prompts"], 0), run
        assert run["request_throughput"] > 0 and 0 < run["median_ttft_ms"] <= run["p99_ttft_ms"], run
        assert run["median_tpot_ms"] > 0, run
        # The server's processes, found under the one the script started, did the work.
        assert run["cpu_s"]["worker_svc"] > 0 and "scheduler_svc" in run["cpu_s"] and "gateway_svc" in run["cpu_s"]
    summary = json.loads(lines[-1])
    assert (summary["model"], summary["input_len"], summary["output_len"]) == ("tiny", 8, 4)
    assert len(summary["cases"]) == 4 and all("vllm" not in case and "vs" not in case for case in summary["cases"])
    by_case = {(c["concurrency"], c["sampling"]): c["stepserve"] for c in summary["cases"]}
    assert by_case[4, "greedy"]["request_throughput"] == runs[3]["request_throughput"].__round__(2)
    assert "OpenAI API at http://127.0.0.1:" in (tmp_path / "stepserve-0.log").read_text()
    assert not pids("served-model-name tiny")  # the server and everything it started are gone
