"""Token sampling, vectorised over the batch: greedy, temperature, top-k, top-p, min-p, seeds.

Order, as in vLLM: the grammar's mask (structured_outputs.py), per-request adjustments (allowed tokens, bad words, min_tokens' stop tokens,
logit bias, penalties: logits_processors.py) -> logits / temperature -> top-k -> top-p -> min-p -> sample. A sample is the
exponential race argmax(probs / E), E ~ Exp(1), which draws from probs without a cumsum search;
a seeded request draws its E from its own generator seeded by (seed, tokens generated so far),
so its tokens do not depend on what else is in the batch. Logprobs are those of the raw logits
(before adjustments, temperature and filters), like vLLM's default.
"""
from dataclasses import dataclass, field

import numpy as np
import torch

from protocol.client_messages import TokenLogprobs
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
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return np.argmax(logits.numpy(), axis=-1)
    return torch.argmax(logits, dim=-1).cpu().numpy()


def sample(logits: torch.Tensor, meta: SamplingMetadata
           ) -> tuple[np.ndarray, list[TokenLogprobs | None] | None]:
    """logits: [S, V] float32 -> token ids [S] (numpy int64) and per-row logprobs or None."""
    wants_logprobs = (meta.num_logprobs >= 0).any()
    raw = logits
    if meta.adjustments is not None or meta.banned or meta.grammar is not None:
        raw = logits.clone() if wants_logprobs else None
        if meta.grammar is not None:
            meta.grammar.apply(logits)
        if meta.adjustments is not None:
            meta.adjustments.apply(logits)
        for row, ids in meta.banned:
            logits[row, ids] = float("-inf")
    if meta.all_greedy:
        tokens = argmax_rows(logits)
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


def _sample_random(logits: torch.Tensor, meta: SamplingMetadata, rows: np.ndarray) -> np.ndarray:
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
    noise = torch.empty_like(probs).exponential_()  # [R, V]
    for i in np.flatnonzero(meta.seed[rows] >= 0):
        row = rows[i]
        generator = torch.Generator(device=device)
        generator.manual_seed(int(meta.seed[row]) * 1_000_003 + int(meta.num_generated[row]))
        noise[i] = torch.empty_like(probs[i]).exponential_(generator=generator)
    return argmax_rows(probs / noise)


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
