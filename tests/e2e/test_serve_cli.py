"""`stepserve serve` and `stepserve bench serve` as a user runs them: real processes, output parsed."""
import json
import subprocess

import openai
import pytest

from tests.cli_helpers import SMALL, STEPSERVE, pids, until_ctrl_c
from tests.e2e_helpers import free_port


def bench(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([*STEPSERVE, "bench", "serve", "--num-prompts", "40", "--input-len", "8", "--output-len", "4",
                          *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Serving Benchmark Result" in out.stdout and "Median TTFT (ms):" in out.stdout
    return out


def test_serve_answers_openai_and_bench_serve_measures_it_both_ways(tmp_path):
    port, frontend, workers = free_port(), free_port(), free_port()
    with until_ctrl_c("serve", *SMALL, "--port", str(port), "--served-model-name", "small",
                      "--max-prompts-per-request", "2", "--max-request-body-bytes", "100000",
                      "--frontend", f"tcp://127.0.0.1:{frontend}",
                      "--worker-address", f"tcp://127.0.0.1:{workers}") as line:
        assert f"http://127.0.0.1:{port}/v1" in line
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        out = api.completions.create(model="small", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 3
        with pytest.raises(openai.BadRequestError):  # the gateway's limits, as serve passed them
            api.completions.create(model="small", prompt=["a", "b", "c"], max_tokens=1)
        with pytest.raises(openai.APIStatusError) as too_large:
            api.completions.create(model="small", prompt="x" * 100_001, max_tokens=1)
        assert too_large.value.status_code == 413

        result_file = tmp_path / "http.json"
        bench("--base-url", f"http://127.0.0.1:{port}", "--served-model-name", "small", "--request-rate", "200",
              "--json", str(result_file))
        http = json.loads(result_file.read_text())
        sdk = json.loads(bench("--address", f"tcp://127.0.0.1:{frontend}", "--request-rate", "inf",
                               "--max-concurrency", "8", "--json").stdout.strip().splitlines()[-1])
        for result, backend in ((http, "http"), (sdk, "sdk")):
            assert (result["backend"], result["completed"], result["failed"]) == (backend, 40, 0)
            assert result["request_throughput"] > 0
            assert result["output_throughput"] == pytest.approx(4 * result["request_throughput"])
            assert 0 < result["median_ttft_ms"] <= result["p99_ttft_ms"] and result["median_itl_ms"] > 0
        assert sdk["max_concurrency"] == 8 and http["request_rate"] == 200
        assert pids(f"gateway_svc .*--port {port}") and pids(f"worker_svc .*127.0.0.1:{workers}")
    for pattern in (f"gateway_svc .*--port {port}", f"scheduler_svc .*127.0.0.1:{workers}",
                    f"worker_svc .*127.0.0.1:{workers}"):
        assert not pids(pattern), pattern


def test_api_server_count_starts_gateways_that_share_the_port():
    port = free_port()
    with until_ctrl_c("serve", *SMALL, "--port", str(port), "--api-server-count", "2") as line:
        assert f"http://127.0.0.1:{port}/v1" in line
        assert len(pids(f"gateway_svc .*--port {port} .*--reuse-port")) == 2
        for _ in range(6):  # a connection each: the kernel picks the gateway that answers it
            with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused") as api:
                out = api.completions.create(model="micro-llama", prompt=[5, 6, 7], max_tokens=2,
                                             extra_body={"ignore_eos": True})
                assert out.usage.completion_tokens == 2
    assert not pids(f"gateway_svc .*--port {port}")
