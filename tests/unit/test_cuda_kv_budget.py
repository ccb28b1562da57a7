"""--gpu-memory-utilization is a share per worker (vLLM's meaning): two replicas on one GPU at
0.45 each both get a KV cache, whichever starts first (worker_svc/kv_cache.py)."""
from worker_svc.kv_cache import cuda_kv_budget

GB = 1 << 30
TOTAL, CONTEXT, WEIGHTS = 140 * GB, GB // 2, GB // 4


def test_two_replicas_at_045_each_get_their_share():
    # the first to measure sees the device empty but for its own context and weights
    first = cuda_kv_budget(TOTAL - CONTEXT - WEIGHTS, TOTAL, WEIGHTS, 0.45)
    # the second sees the first's cache as used: its share is still 0.45 of the device
    second = cuda_kv_budget(TOTAL - 2 * (CONTEXT + WEIGHTS) - first, TOTAL, WEIGHTS, 0.45)
    assert first == second == int(0.45 * TOTAL) - WEIGHTS


def test_never_more_than_is_free():
    assert cuda_kv_budget(10 * GB, TOTAL, WEIGHTS, 0.9) == 10 * GB
    assert cuda_kv_budget(10 * GB, TOTAL, WEIGHTS, 0.9, reserved_bytes=GB) == 9 * GB
