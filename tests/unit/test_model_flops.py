"""stepserve/bench/model_flops.py counts a model's matrix work from its config; transformers'
own module of the same config is the reference: its decoder layers' linear weights, and its head."""
import pytest
import torch

from benchmarks.hf_generate import build_hf_model
from stepserve.bench.model_flops import (attention_flops, head_gemm, kv_bytes_per_token, layer_gemms,
                                        limit_requests_per_second, model_config, request_flops,
                                        roofline_requests_per_second, weight_bytes)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-opt"])
def test_gemms_are_the_linear_layers_transformers_builds(preset):
    config = model_config(preset)
    model = build_hf_model(preset, torch.float32)
    decoder_layers = model.model.decoder.layers if config["model_type"] == "opt" else model.model.layers
    linear_macs = sum(m.in_features * m.out_features for m in decoder_layers.modules()
                      if isinstance(m, torch.nn.Linear))
    assert sum(g.in_features * g.out_features * g.count for g in layer_gemms(config)) == linear_macs
    head = model.get_output_embeddings()
    assert head_gemm(config).in_features * head_gemm(config).out_features == head.weight.numel()


def test_qwen3_0_6b_request_at_16_in_16_out():
    """The figures issue 33 was filed with: about 28 GFLOP outside the head and 5 in it."""
    config = model_config("qwen3-0.6b")
    head = head_gemm(config).flops(16)
    assert round(head / 1e9, 1) == 5.0
    assert round((request_flops(config, 16, 16) - head) / 1e9) == 27


def test_limit_is_the_time_each_part_takes_at_its_rate():
    config = model_config("tiny-llama")
    same = {"prefill_tflops": 1.0, "decode_tflops": 1.0, "head_tflops": 1.0}
    assert limit_requests_per_second(config, same, 16, 16) == pytest.approx(1e12 / request_flops(config, 16, 16))
    slow_head = {**same, "head_tflops": 0.5}
    assert limit_requests_per_second(config, slow_head, 16, 16) < limit_requests_per_second(config, same, 16, 16)


def test_qwen3_0_6b_kv_and_weights_a_decode_step_reads():
    """The figures the 512/128 trace was read with: 2 GiB of bf16 KV holds 18,724 tokens, and a
    decode step reads ~1.2 GB of weights (the tied head counted as the head it is)."""
    config = model_config("qwen3-0.6b")
    assert kv_bytes_per_token(config, 2) == 114_688
    assert (2 << 30) // kv_bytes_per_token(config, 2) == 18_724
    assert round(weight_bytes(config, 2) / 1e9, 2) == 1.19


def test_roofline_with_unbounded_memory_is_the_arithmetic_attention_included():
    config = model_config("tiny-llama")
    rates = {"prefill_tflops": 1.0, "decode_tflops": 1.0, "head_tflops": 1.0, "memory_gbps": 1e12,
             "dtype": "bfloat16"}
    attention = attention_flops(config, 16 * 17 // 2) + sum(attention_flops(config, c) for c in range(17, 32))
    expected = 1e12 / (request_flops(config, 16, 16) + attention)
    assert roofline_requests_per_second(config, rates, 16, 16, decode_batch=256) == pytest.approx(expected)
    assert expected < limit_requests_per_second(config, rates, 16, 16)


def test_roofline_holds_long_decodes_to_their_reads():
    """At 512 in / 128 out with a slow memory, every decode step costs its reads: the weights
    shared by the batch and each sequence's own KV, so a bigger batch helps only the first."""
    config = model_config("qwen3-0.6b")
    fast = {"prefill_tflops": 1e6, "decode_tflops": 1e6, "head_tflops": 1e6, "memory_gbps": 1.0,
            "dtype": "bfloat16"}
    kv = kv_bytes_per_token(config, 2)

    def reads(batch):
        return sum(weight_bytes(config, 2) / batch + c * kv for c in range(513, 640)) / 1e9

    for batch in (1, 32):
        assert 1 / roofline_requests_per_second(config, fast, 512, 128, batch) == pytest.approx(reads(batch), rel=1e-3)
    float32 = {**fast, "dtype": "float32"}
    assert roofline_requests_per_second(config, float32, 512, 128, 32) == pytest.approx(
        roofline_requests_per_second(config, fast, 512, 128, 32) / 2, rel=1e-3)


def test_matmul_limit_runs_with_the_prepacked_linear():
    """benchmarks/matmul_limit.py times oneDNN's prepacked linear beside F.linear (F.linear alone
    understated the limit): the prepacked one computes the same product, and the limit comes out."""
    from benchmarks import matmul_limit
    for dtype in (torch.bfloat16, torch.float32):
        weight = torch.randn(96, 64, dtype=dtype)
        x = torch.randn(8, 64, dtype=dtype)
        prepacked = matmul_limit._prepacked_linear(weight, 8)
        # oneDNN packs bfloat16 only with AVX512 or AVX-NE-CONVERT: None elsewhere, as for no oneDNN
        assert (prepacked is not None) == (torch.backends.mkldnn.is_available() and (
            dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()))
        if prepacked is not None:
            torch.testing.assert_close(prepacked(x), torch.nn.functional.linear(x, weight))
    result = matmul_limit.measure("tiny-llama", "bfloat16", decode_batch=8, prefill_tokens=16, repeats=1,
                                  memory_mib=16)
    assert all(result[key] > 0 for key in ("decode_tflops", "prefill_tflops", "head_tflops", "memory_gbps"))
