"""Sampler semantics: greedy ties, temperature, top-k, top-p, min-p, seeds, bans, logprobs."""
import math

import numpy as np
import torch

from worker_svc.sampler import SamplingMetadata, argmax_rows, sample


def _meta(num_rows: int, **columns) -> SamplingMetadata:
    defaults = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=-1, num_generated=0,
                    num_logprobs=-1)
    defaults.update(columns)
    dtypes = dict(temperature=np.float32, top_p=np.float32, min_p=np.float32)
    return SamplingMetadata(**{k: np.full(num_rows, v, dtype=dtypes.get(k, np.int64))
                               for k, v in defaults.items()})


def _logits_from_probs(probs: list[float], num_rows: int) -> torch.Tensor:
    return torch.tensor(probs).log().repeat(num_rows, 1)  # [R, V]


def _tokens_seen(probs: list[float], num_rows: int = 2000, **columns) -> set[int]:
    tokens, _ = sample(_logits_from_probs(probs, num_rows), _meta(num_rows, **columns))
    return set(tokens.tolist())


PROBS = [0.5, 0.3, 0.15, 0.05]


def test_greedy_ties_resolve_to_lowest_index():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -1.0, -3.0]])
    assert argmax_rows(logits).tolist() == [1, 0, 0]
    tokens, logprobs = sample(logits.clone(), _meta(3, temperature=0.0))
    assert tokens.tolist() == [1, 0, 0] and logprobs is None


def test_unfiltered_sampling_reaches_every_token():
    assert _tokens_seen(PROBS) == {0, 1, 2, 3}


def test_temperature_sharpens_and_flattens():
    frequencies = lambda t: np.bincount(  # noqa: E731
        sample(_logits_from_probs(PROBS, 4000), _meta(4000, temperature=t))[0], minlength=4) / 4000
    assert frequencies(0.05)[0] > 0.99  # near greedy
    assert abs(frequencies(1.0)[0] - 0.5) < 0.04  # the model's own distribution
    assert frequencies(100.0)[3] > 0.2  # near uniform: the 5% token gets ~25%


def test_top_k_keeps_the_k_most_likely():
    assert _tokens_seen(PROBS, top_k=2) == {0, 1}
    assert _tokens_seen(PROBS, top_k=1) == {0}


def test_top_p_keeps_the_token_that_crosses_p():
    assert _tokens_seen(PROBS, top_p=0.7) == {0, 1}  # 0.5 < 0.7, 0.5 + 0.3 crosses
    assert _tokens_seen(PROBS, top_p=0.5) == {0}
    assert _tokens_seen(PROBS, top_p=0.81) == {0, 1, 2}


def test_min_p_drops_tokens_below_a_fraction_of_the_top():
    assert _tokens_seen(PROBS, min_p=0.2) == {0, 1, 2}  # threshold 0.1
    assert _tokens_seen(PROBS, min_p=0.7) == {0}  # threshold 0.35


def test_filters_apply_per_row():
    meta = _meta(5)
    meta.top_k[:] = [1, 0, 0, 0, 0]
    meta.top_p[:] = [1.0, 0.5, 1.0, 1.0, 1.0]
    meta.min_p[:] = [0.0, 0.0, 0.7, 0.0, 0.0]
    meta.temperature[:] = [1.0, 1.0, 1.0, 0.0, 1.0]  # row 3 greedy, row 4 unfiltered
    last_row = set()
    for _ in range(60):
        tokens, _ = sample(_logits_from_probs(PROBS, 5), meta)
        assert tokens[:4].tolist() == [0, 0, 0, 0]
        last_row.add(int(tokens[4]))
    assert len(last_row) > 1


def test_seeded_rows_do_not_depend_on_the_batch():
    vocab_size = 500
    logits = torch.randn(65, vocab_size, generator=torch.Generator().manual_seed(0))
    meta = _meta(65, seed=-1, num_generated=3)
    meta.seed[7] = 1234
    alone = _meta(1, seed=1234, num_generated=3)
    draws = [sample(logits.clone(), meta)[0][7] for _ in range(5)]
    assert set(draws) == {sample(logits[7:8].clone(), alone)[0][0]}
    # another step (num_generated) or another seed draws differently at least once
    others = {sample(logits[7:8].clone(), _meta(1, seed=s, num_generated=g))[0][0]
              for s, g in [(1234, 4), (1234, 5), (99, 3), (7, 3), (8, 3), (9, 3)]}
    assert len(others | set(draws)) > 1


def test_banned_tokens_are_never_sampled():
    meta = _meta(2, temperature=0.0)
    meta.banned = [(0, [0]), (1, [0, 1])]
    tokens, _ = sample(_logits_from_probs(PROBS, 2), meta)
    assert tokens.tolist() == [1, 2]


def test_logprobs_are_the_raw_log_softmax_with_top_n():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    meta = _meta(2, temperature=0.0, num_logprobs=2)
    meta.num_logprobs[1] = -1
    tokens, logprobs = sample(logits.clone(), meta)
    expected = torch.log_softmax(logits[0], dim=-1)
    assert logprobs[1] is None
    first = logprobs[0]
    assert first.token_id == 1 and math.isclose(first.logprob, expected[1].item(), rel_tol=1e-6)
    assert first.top_token_ids == [1, 2]
    assert np.allclose(first.top_logprobs, expected[[1, 2]].tolist())
    meta = _meta(1, temperature=0.0, num_logprobs=0)  # logprobs=0: only the sampled token's
    _, logprobs = sample(logits[:1].clone(), meta)
    assert logprobs[0].top_token_ids == [] and logprobs[0].token_id == 1
