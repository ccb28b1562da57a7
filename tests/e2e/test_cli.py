"""The `stepserve` command as a user runs it: real processes, output parsed."""
import json
import subprocess

from client_sdk import Client, SamplingParams
from stepserve.bench.model_flops import limit_requests_per_second, model_config, roofline_requests_per_second
from tests.cli_helpers import SMALL, STEPSERVE, pids, until_ctrl_c
from tests.e2e_helpers import free_port

def test_bench_throughput_prints_vllm_line_and_json(tmp_path):
    rates = {"prefill_tflops": 0.5, "decode_tflops": 0.4, "head_tflops": 0.3, "memory_gbps": 20.0, "dtype": "bfloat16"}
    (tmp_path / "limit.json").write_text(json.dumps(rates))
    out = subprocess.run([*STEPSERVE, "bench", "throughput", *SMALL, "--num-prompts", "300", "--input-len", "8",
                          "--output-len", "4", "--prefix-len", "32", "--gemm-limit", str(tmp_path / "limit.json"),
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-2].startswith("Throughput: ") and "requests/s" in lines[-2] and "output tokens/s" in lines[-2]
    result = json.loads(lines[-1])
    assert result["num_prompts"] == 300 and result["requests_per_second"] > 0
    assert result["tokens_per_second"] > result["output_tokens_per_second"] > 0
    assert result["config"]["model"] == "micro-llama"
    # Each prompt is the shared 32 tokens (two blocks), then 8 of its own. A replica's prefix is
    # cached once the result of the step that computed it is applied; with async scheduling the
    # step after it was planned before that, so the prompts admitted in a replica's first two
    # steps compute it themselves, and the later ones find both blocks.
    assert result["prefix_len"] == 32 and result["prefix_cache_queries"] == 300 * 40
    assert result["prefix_cache_hits"] >= 32 and result["prefix_cache_hits"] % 32 == 0
    # the fractions count the whole 40-token prompts, the 300 sequences decoding together
    config, rps = model_config("micro-llama"), result["requests_per_second"]
    assert result["gemm_fraction"] == round(rps / limit_requests_per_second(config, rates, 40, 4), 3)
    assert result["roofline_fraction"] == round(rps / roofline_requests_per_second(config, rates, 40, 4, 256), 3)


def test_generate_prints_a_completion():
    out = subprocess.run([*STEPSERVE, "generate", *SMALL, "--max-tokens", "5", "--ignore-eos", "hello"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_up_serves_until_ctrl_c_then_stops_everything():
    frontend, workers = free_port(), free_port()
    with until_ctrl_c("up", *SMALL, "--frontend", f"tcp://127.0.0.1:{frontend}",
                      "--worker-address", f"tcp://127.0.0.1:{workers}"):
        with Client(f"tcp://127.0.0.1:{frontend}", timeout_s=60) as client:
            out = client.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
            assert len(out.outputs[0].token_ids) == 3
        assert pids(f"scheduler_svc .*127.0.0.1:{workers}") and pids(f"worker_svc .*127.0.0.1:{workers}")
    # The scheduler and the worker ran in their own sessions; none may outlive `up`.
    assert not pids(f"scheduler_svc .*127.0.0.1:{workers}") and not pids(f"worker_svc .*127.0.0.1:{workers}")


def test_prefix_caching_flags_reach_the_scheduler():
    import argparse

    from stepserve.cluster_args import add_cluster_flags, cluster_args
    from scheduler_svc.__main__ import parse_args

    parser = argparse.ArgumentParser()
    add_cluster_flags(parser)
    assert "--enable-prefix-caching" not in cluster_args(parser.parse_args([]))[0]  # the scheduler's default
    for flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
        scheduler_argv = cluster_args(parser.parse_args([flag]))[0]
        assert scheduler_argv == [flag]
        assert parse_args(scheduler_argv).enable_prefix_caching == (flag == "--enable-prefix-caching")
    assert parse_args([]).enable_prefix_caching is True


def test_models_lists_every_architecture_and_rope_type_and_tiny_qwen3_benches():
    from worker_svc.models import ROPE_TYPES, supported_architectures
    out = subprocess.run([*STEPSERVE, "models"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = {line.strip() for line in out.stdout.splitlines()}
    assert {"Qwen3ForCausalLM", "Phi3ForCausalLM", "LlamaForCausalLM"} <= listed
    assert set(supported_architectures()) <= listed  # the registry's, other families' included
    assert all(rope_type in out.stdout for rope_type in ROPE_TYPES) and "tiny-qwen3" in out.stdout
    out = subprocess.run([*STEPSERVE, "bench", "throughput", "--model", "tiny-qwen3", "--enforce-eager",
                          "--num-prompts", "16", "--input-len", "8", "--output-len", "4", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["num_prompts"] == 16
