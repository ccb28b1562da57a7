"""The sampler's draws against the distribution they must follow: softmax(logits / T) after top-k,
top-p and min-p, measured by total variation over many draws, on the C++ kernel and on the torch
path alike; seeded draws against the same draws in other batches; the grammar's bitmask."""
import numpy as np
import pytest
import torch

from worker_svc import sampler, sampling_kernel
from worker_svc.sampler import SamplingMetadata, sample, uniform_draws

NUM_DRAWS = 100_000
# Total variation of 100k draws from the right distribution stays under ~0.01 on 40 tokens; each
# wrong variant below (a temperature 15% off, top-k one short, top-p's crossing token dropped,
# min-p off) moves the distribution by more than 0.03.
TV_BOUND = 0.02
WRONG_BY = 0.03


def _meta(num_rows: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=-1, num_generated=0):
    column = lambda v, dtype: np.full(num_rows, v, dtype=dtype)  # noqa: E731
    return SamplingMetadata(column(temperature, np.float32), column(top_k, np.int64), column(top_p, np.float32),
                            column(min_p, np.float32), column(seed, np.int64), column(num_generated, np.int64),
                            column(-1, np.int64))


def expected_distribution(logits: torch.Tensor, temperature, top_k=0, top_p=1.0, min_p=0.0) -> np.ndarray:
    """vLLM's definition, written plainly: sort (stable), keep k, keep the prefix whose mass before
    each token is under p (of the top-k mass), drop what is under min_p times the best."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    order = torch.sort(logits, descending=True, stable=True).indices
    kept = order[:top_k] if top_k > 0 else order
    mass = probs[kept] / probs[kept].sum()
    before = torch.cumsum(mass, 0) - mass
    if top_p < 1:
        kept = kept[(before < top_p) | (torch.arange(len(kept)) == 0)]
    out = torch.zeros_like(probs)
    out[kept] = probs[kept]
    out[out < min_p * out.max()] = 0
    return (out / out.sum()).numpy()


@pytest.fixture
def kernel():
    module = sampling_kernel.load()
    if module is None:
        pytest.fail("the C++ sampling kernel does not build here")
    return module


@pytest.fixture(params=["kernel", "torch"])
def path(request, monkeypatch):
    if request.param == "kernel":
        request.getfixturevalue("kernel")
    else:
        monkeypatch.setattr(sampler.sampling_kernel, "load", lambda: None)
    return request.param


def _frequencies(logits: torch.Tensor, meta: SamplingMetadata) -> np.ndarray:
    tokens, _ = sample(logits.repeat(len(meta.temperature), 1), meta)
    return np.bincount(tokens, minlength=logits.shape[-1]) / len(tokens)


def _tv(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


LOGITS = torch.randn(40, generator=torch.Generator().manual_seed(3)) * 1.5

CASES = [  # (temperature, top_k, top_p, min_p), and a wrong variant of each that must be told apart
    ((1.0, 0, 1.0, 0.0), (1.15, 0, 1.0, 0.0)),
    ((0.7, 0, 1.0, 0.0), (0.8, 0, 1.0, 0.0)),
    ((0.8, 5, 1.0, 0.0), (0.8, 4, 1.0, 0.0)),
    ((1.3, 0, 0.8, 0.0), (1.3, 0, 0.7, 0.0)),
    ((0.8, 10, 0.9, 0.0), (0.8, 10, 0.8, 0.0)),
    ((1.0, 0, 1.0, 0.2), (1.0, 0, 1.0, 0.0)),
    ((1.0, 8, 0.7, 0.1), (1.0, 8, 0.6, 0.1)),
]


@pytest.mark.parametrize("case, wrong", CASES)
def test_draws_follow_the_truncated_softmax(path, case, wrong):
    frequencies = _frequencies(LOGITS, _meta(NUM_DRAWS, *case))
    right = expected_distribution(LOGITS, *case)
    assert not frequencies[right == 0].any(), "a token outside the kept set was drawn"
    assert _tv(frequencies, right) < TV_BOUND
    assert _tv(right, expected_distribution(LOGITS, *wrong)) > WRONG_BY  # the bound can tell them apart


def test_top_p_over_a_flat_vocabulary(path):
    """Top-p whose cut lies past the 64 best tokens: the kernel bisects for it."""
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(4)) * 0.3
    right = expected_distribution(logits, 1.0, top_p=0.5)
    assert (right > 0).sum() > 300
    frequencies = _frequencies(logits, _meta(50_000, top_p=0.5))
    assert not frequencies[right == 0].any(), "a token outside the kept set was drawn"
    assert _tv(frequencies, right) < 0.08  # ~0.05 expected from 50k draws over ~400 tokens
    assert _tv(right, expected_distribution(logits, 1.0, top_p=0.45)) > 0.09


@pytest.mark.parametrize("top_k", [10, 200])
def test_top_k_over_a_large_vocabulary(path, top_k):
    """k well under the number of 64-token chunks (the kernel's chunk maxima) and not (bisection)."""
    logits = torch.randn(5000, generator=torch.Generator().manual_seed(8)) * 2
    right = expected_distribution(logits, 1.0, top_k=top_k, top_p=0.99)
    frequencies = _frequencies(logits, _meta(40_000, top_k=top_k, top_p=0.99))
    assert not frequencies[right == 0].any(), "a token outside the kept set was drawn"
    assert _tv(frequencies, right) < 0.05


def test_seeded_draws_do_not_depend_on_the_batch_or_the_path(path):
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(5))
    meta = _meta(64, temperature=0.9, top_k=50, top_p=0.95, num_generated=7)
    meta.seed[:] = np.arange(64) + 100
    batch, _ = sample(logits.clone(), meta)
    for row in (0, 17, 63):
        alone, _ = sample(logits[row:row + 1].clone(), _meta(1, 0.9, 50, 0.95, seed=100 + row, num_generated=7))
        assert alone[0] == batch[row]
    again, _ = sample(logits.clone(), meta)
    assert (again == batch).all()
    meta.num_generated[:] = 8  # the next position draws anew
    assert (sample(logits.clone(), meta)[0] != batch).any()


def test_uniform_draws_are_uniform_and_seeded_per_position():
    seeds = np.arange(200_000, dtype=np.int64)
    draws = uniform_draws(seeds, np.zeros_like(seeds))
    assert ((draws >= 0) & (draws < 1)).all()
    histogram = np.bincount((draws * 20).astype(int), minlength=20) / len(draws)
    assert np.abs(histogram - 0.05).max() < 0.003
    assert (uniform_draws(seeds[:5], np.zeros(5, np.int64)) == draws[:5]).all()
    assert (uniform_draws(seeds[:5], np.ones(5, np.int64)) != draws[:5]).all()


def test_kernel_applies_the_bitmask_to_greedy_and_sampled_rows(kernel):
    vocab_size = 100
    logits = torch.randn(4, vocab_size, generator=torch.Generator().manual_seed(6))
    allowed = [3, 37, 64, 99]
    bitmask = torch.zeros(4, 4, dtype=torch.int32)
    for token in allowed:
        bitmask[:, token // 32] |= 1 << (token % 32)
    constrained = torch.tensor([True, True, True, False])
    temperature = torch.tensor([0.0, 1.0, 5.0, 1.0])
    seen = set()
    for _ in range(200):
        out = torch.empty(4, dtype=torch.int64)
        kernel.sample_rows(logits, temperature, torch.zeros(4, dtype=torch.int64), torch.ones(4), torch.zeros(4),
                           torch.rand(4, dtype=torch.float64), bitmask, constrained, out)
        assert out[0] == allowed[int(logits[0, allowed].argmax())]
        assert out[1].item() in allowed and out[2].item() in allowed
        seen.add(out[3].item())
    assert not seen <= set(allowed)  # the unconstrained row is not masked


def test_kernel_reads_bfloat16_logits_as_their_float32_values(kernel):
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(7)).bfloat16()
    args = [torch.full((8,), 0.8), torch.full((8,), 20, dtype=torch.int64), torch.full((8,), 0.9), torch.zeros(8),
            torch.rand(8, dtype=torch.float64), torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.bool)]
    as_bf16, as_fp32 = torch.empty(8, dtype=torch.int64), torch.empty(8, dtype=torch.int64)
    kernel.sample_rows(logits, *args, as_bf16)
    kernel.sample_rows(logits.float(), *args, as_fp32)
    assert (as_bf16 == as_fp32).all()
