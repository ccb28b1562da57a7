"""benchmarks/gpu_check.sh, the prepared checks of a lent GPU machine, end to end on CPU at tiny
sizes: every part runs (a Llama folder against transformers through a real cluster, the bench
CLI with async scheduling on and off, the step split, two replicas) and its JSON lines say what
they should."""
import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--device", "cpu", "--families", "llama", "--dtypes", "float32", "--modes", "eager",
        "--bench-model", "micro-llama", "--bench-eager", "--num-prompts", "48,96",
        "--step-batch", "8", "--step-count", "2", "--parallel", "1"]


def test_gpu_check_runs_on_cpu(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["sh", os.path.join(REPO, "benchmarks", "gpu_check.sh"), str(out), *TINY],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [json.loads(line) for line in done.stdout.splitlines()] == lines  # printed as saved
    by_check = {}
    for line in lines:
        assert "error" not in line and "skipped" not in line, line
        by_check.setdefault(line["check"], []).append(line)
    assert by_check["device"][0]["device"] == "cpu"
    (exact,) = by_check["exactness"]
    assert exact["family"] == "llama" and exact["mode"] == "eager" and exact["judged"] and exact["equal"], exact
    assert exact["graphs_captured"] == 0  # a CPU worker never captures
    runs = {(r["async_scheduling"], r["num_prompts"]): r for r in by_check["throughput"]}
    assert set(runs) == {(True, 48), (True, 96), (False, 48), (False, 96)}
    assert all(r["requests_per_second"] > 0 and r["output_len"] == 16 for r in runs.values())
    for ratio in by_check["throughput_ratio"]:
        rates = runs[ratio["async_scheduling"], 96], runs[ratio["async_scheduling"], 48]
        assert ratio["ratio"] == round(rates[0]["requests_per_second"] / rates[1]["requests_per_second"], 3)
    assert {r["num_prompts"] for r in by_check["async_ratio"]} == {48, 96}
    assert all(0 < b["worker_busy_fraction"] <= 1 and b["mean_step_time_ms"] > 0 for b in by_check["busy"])
    (step,) = by_check["runner_step"]
    assert step["config"]["device"] == "cpu" and step["eager"]["step"] > 0
    (replicas,) = by_check["replicas"]
    assert replicas["replicas"] == 2 and replicas["requests_per_second"] > 0
    assert replicas["one_replica_requests_per_second"] == runs[True, 48]["requests_per_second"]
