"""Token sampling, vectorised over the batch: greedy, temperature, top-k, top-p, min-p, seeds.

Order, as in vLLM: the grammar's mask (structured_outputs.py), per-request adjustments (allowed
tokens, bad words, min_tokens' stop tokens, logit bias, penalties: logits_processors.py) ->
logits / temperature -> top-k -> top-p -> min-p -> draw. On CPU one C++ call does the mask, the
filters and the draw of every row (csrc/sample_rows.cpp); elsewhere, or without a compiler,
torch does the same. A draw is the inverse of the kept tokens' cumulative distribution at one
uniform per row: a seeded request's uniform comes from (seed, tokens generated so far) alone, so
its tokens do not depend on what else is in the batch. Rows that are all greedy with no mask
take numpy's argmax (or the compiled step's, greedy_head.py). Logprobs are those of the raw
logits (before adjustments, temperature and filters), like vLLM's default.
"""
from dataclasses import dataclass, field

import numpy as np
import torch

from protocol.client_messages import TokenLogprobs
from worker_svc import sampling_kernel
from worker_svc.logits_processors import StepAdjustments
from worker_svc.structured_outputs import StepGrammar


@dataclass
class SamplingMetadata:
    """Per sampled row (aligned with the logits rows)."""

    temperature: np.ndarray  # [S] float32, 0 = greedy
    top_k: np.ndarray  # [S] int64, <= 0 = off
    top_p: np.ndarray  # [S] float32, 1 = off
    min_p: np.ndarray  # [S] float32, 0 = off
    seed: np.ndarray  # [S] int64, -1 = unseeded
    num_generated: np.ndarray  # [S] int64, tokens generated so far (varies the seeded draw)
    num_logprobs: np.ndarray  # [S] int64, -1 = no logprobs
    # (row, token ids) whose sampling is forbidden this step: stop tokens before min_tokens.
    banned: list[tuple[int, list[int]]] = field(default_factory=list)
    adjustments: StepAdjustments | None = None  # None: no row has penalties, bias, ...
    grammar: StepGrammar | None = None  # None: no row is constrained

    @property
    def all_greedy(self) -> bool:
        return not self.temperature.any()

    @property
    def argmax_only(self) -> bool:
        """Every row takes the raw logits' argmax: the fused greedy head serves them all."""
        return (self.all_greedy and not self.banned and self.adjustments is None and self.grammar is None
                and not (self.num_logprobs >= 0).any())


def argmax_rows(logits: torch.Tensor) -> np.ndarray:
    """Row argmax, ties to the lowest index. On CPU numpy's argmax is several times faster than
    torch.argmax over [256, 32000] float32 (benchmarks/runner_step.py prints both)."""
    if logits.device.type == "cpu":
        return np.argmax(logits.float().numpy(), axis=-1)
    return torch.argmax(logits, dim=-1).cpu().numpy()


def sample(logits: torch.Tensor, meta: SamplingMetadata
           ) -> tuple[np.ndarray, list[TokenLogprobs | None] | None]:
    """logits: [S, V] (any float dtype) -> token ids [S] (numpy int64) and per-row logprobs or None."""
    wants_logprobs = (meta.num_logprobs >= 0).any()
    if meta.grammar is not None:
        meta.grammar.wait()  # the bitmask's fill, started before the forward
    kernel = sampling_kernel.load() if logits.device.type == "cpu" else None
    if kernel is None or meta.adjustments is not None or meta.banned or wants_logprobs:
        logits = logits.float()  # written to, or read by torch: the kernel alone reads bfloat16
    # The kernel applies the grammar's bitmask as it reads a row; the torch path masks the logits.
    kernel_masks = meta.grammar is not None and kernel is not None
    masks_logits = meta.grammar is not None and kernel is None
    raw = logits
    if meta.adjustments is not None or meta.banned or masks_logits:
        raw = logits.clone() if wants_logprobs else None
        if masks_logits:
            meta.grammar.apply(logits)
        if meta.adjustments is not None:
            meta.adjustments.apply(logits)
        for row, ids in meta.banned:
            logits[row, ids] = float("-inf")
    if meta.all_greedy and not kernel_masks:
        tokens = argmax_rows(logits)
    elif kernel is not None:
        tokens = _sample_with_kernel(kernel, logits, meta)
    else:
        tokens = np.empty(logits.shape[0], dtype=np.int64)
        greedy = meta.temperature == 0
        if greedy.any():
            tokens[greedy] = argmax_rows(logits[torch.from_numpy(greedy)])
        rows = np.flatnonzero(~greedy)
        tokens[rows] = _sample_random(logits[torch.from_numpy(rows)], meta, rows)
    logprobs = None
    if wants_logprobs:
        logprobs = compute_logprobs(raw, tokens, meta.num_logprobs)
    return tokens, logprobs


def _sample_with_kernel(kernel, logits: torch.Tensor, meta: SamplingMetadata) -> np.ndarray:
    tokens = torch.empty(logits.shape[0], dtype=torch.int64)
    bitmask = constrained = _NO_MASK
    if meta.grammar is not None and meta.grammar.indices:
        bitmask = meta.grammar.bitmask
        constrained = torch.zeros(logits.shape[0], dtype=torch.bool)
        constrained[meta.grammar.indices] = True
    kernel.sample_rows(logits, torch.from_numpy(meta.temperature), torch.from_numpy(meta.top_k),
                       torch.from_numpy(meta.top_p), torch.from_numpy(meta.min_p),
                       torch.from_numpy(uniform_draws(meta.seed, meta.num_generated)), bitmask, constrained, tokens)
    return tokens.numpy()


_NO_MASK = torch.empty(0, dtype=torch.int32)
_unseeded = np.random.default_rng()
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A bijective mix of 64-bit integers (SplitMix64's finaliser): nearby inputs, unrelated outputs."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniform_draws(seed: np.ndarray, num_generated: np.ndarray) -> np.ndarray:
    """One uniform in [0, 1) per row: a seeded row's from (seed, tokens generated so far) alone, so
    the same seed and prompt give the same tokens whatever else is in the batch, after a
    preemption or with steps in flight; the others' from the worker's generator."""
    draws = _unseeded.random(len(seed))
    seeded = seed >= 0
    if seeded.any():
        with np.errstate(over="ignore"):
            bits = _splitmix64(_splitmix64(seed[seeded].astype(np.uint64)) + num_generated[seeded].astype(np.uint64))
        draws[seeded] = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return draws


def _sample_random(logits: torch.Tensor, meta: SamplingMetadata, rows: np.ndarray) -> np.ndarray:
    """The torch path (no C++ kernel, or not a CPU): the kernel's semantics, the draw through the
    cumulative distribution at the same uniforms."""
    device = logits.device
    temperature = torch.from_numpy(meta.temperature[rows]).to(device)
    logits = logits / temperature[:, None]  # [R, V]
    top_k, top_p = meta.top_k[rows], meta.top_p[rows]
    if (top_k > 0).any() or (top_p < 1).any():
        logits = _top_k_top_p(logits, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    min_p = meta.min_p[rows]
    if min_p.any():
        threshold = torch.from_numpy(min_p).to(device)[:, None] * probs.amax(-1, keepdim=True)
        probs = probs.masked_fill(probs < threshold, 0.0)
    cdf = probs.double().cumsum(dim=-1)  # [R, V]
    targets = torch.from_numpy(uniform_draws(meta.seed[rows], meta.num_generated[rows])).to(device) * cdf[:, -1]
    tokens = torch.searchsorted(cdf, targets[:, None], right=True)[:, 0]
    return tokens.clamp_(max=logits.shape[-1] - 1).cpu().numpy()


def _top_k_top_p(logits: torch.Tensor, top_k: np.ndarray, top_p: np.ndarray) -> torch.Tensor:
    """Keep each row's k largest logits, then the smallest prefix whose probability mass
    reaches p (the token that crosses p stays); everything else becomes -inf."""
    device, vocab_size = logits.device, logits.shape[-1]
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True, stable=True)  # [R, V]
    k = torch.from_numpy(np.where(top_k > 0, np.minimum(top_k, vocab_size), vocab_size)).to(device)
    rank = torch.arange(vocab_size, device=device)
    sorted_logits = sorted_logits.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
    p = torch.from_numpy(top_p.astype(np.float32)).to(device)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # exclusive prefix sum
    # Rows with p = 1 are left alone: float rounding can push the prefix sum to 1 early.
    outside = (mass_before >= p[:, None]) & (rank[None, :] > 0) & (p[:, None] < 1)
    sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(1, sorted_ids, sorted_logits)


def compute_logprobs(logits: torch.Tensor, tokens: np.ndarray, num_logprobs: np.ndarray
                     ) -> list[TokenLogprobs | None]:
    rows = np.flatnonzero(num_logprobs >= 0)
    logprobs = torch.log_softmax(logits[torch.from_numpy(rows)].float(), dim=-1)  # [N, V]
    sampled = logprobs.gather(1, torch.from_numpy(tokens[rows])[:, None].to(logprobs.device))
    max_n = int(num_logprobs[rows].max())
    top_values, top_ids = logprobs.topk(max_n, dim=-1) if max_n else (logprobs[:, :0],) * 2
    sampled, top_values, top_ids = sampled[:, 0].tolist(), top_values.tolist(), top_ids.tolist()
    out: list[TokenLogprobs | None] = [None] * len(tokens)
    for i, row in enumerate(rows.tolist()):
        n = int(num_logprobs[row])
        out[row] = TokenLogprobs(int(tokens[row]), sampled[i], top_ids[i][:n], top_values[i][:n])
    return out
