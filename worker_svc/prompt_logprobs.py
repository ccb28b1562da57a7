"""Prompt logprobs (SamplingParams.prompt_logprobs, vLLM's): the logprob of each prompt token
given the tokens before it, plus the top K, computed from the hidden states the step's forward
already produced for the prompt chunk (no second pass). With chunked prefill each chunk scores
the prompt tokens its positions predict: position p's hidden state scores token p + 1, so a
chunk [start, end) scores tokens start + 1 .. min(end, num_prompt - 1); the first prompt token
has nothing before it and no logprob.

The scheduler skips the prefix cache for such requests (cached blocks have KV but no hidden
states), so every prompt position is computed; after a recompute preemption the prompt is
scored again and the scheduler keeps the entries it did not have.

Logits are computed in slices of MAX_ROWS positions, so a long prompt never holds
[prompt_len, vocab] float32 logits at once.
"""
from collections.abc import Callable

import numpy as np
import torch

from protocol.client_messages import TokenLogprobs
from worker_svc.sampler import compute_logprobs

MAX_ROWS = 256


def score_prompts(logits_of: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                  token_ids: np.ndarray, rows: np.ndarray, num_prompt: np.ndarray, num_computed: np.ndarray,
                  query_lens: np.ndarray, num_logprobs: np.ndarray
                  ) -> dict[int, tuple[int, list[TokenLogprobs]]]:
    """Per sequence j of the step (token order, before the step advances them): token_ids[rows[j]]
    its tokens, num_prompt / num_computed / query_lens / num_logprobs (-1: not asked) [B].
    hidden: [T, hidden] of the whole step. Returns j -> (first prompt index scored, entries)."""
    starts = np.cumsum(query_lens) - query_lens  # each sequence's first token on the step's axis
    chunks, hidden_rows, targets, ks = [], [], [], []
    for j in np.flatnonzero(num_logprobs >= 0).tolist():
        first, last = int(num_computed[j]), min(int(num_computed[j] + query_lens[j]), int(num_prompt[j]) - 1)
        if last <= first:
            continue  # a decode, or a chunk holding only the prompt's last token
        positions = np.arange(first, last)
        chunks.append((j, first + 1, len(positions)))
        hidden_rows.append(starts[j] + positions - first)
        targets.append(token_ids[rows[j], positions + 1])
        ks.append(np.full(len(positions), num_logprobs[j]))
    if not chunks:
        return {}
    hidden_rows, targets, ks = np.concatenate(hidden_rows), np.concatenate(targets), np.concatenate(ks)
    entries: list[TokenLogprobs] = []
    for begin in range(0, len(hidden_rows), MAX_ROWS):
        rows = torch.from_numpy(hidden_rows[begin:begin + MAX_ROWS]).to(hidden.device)
        logits = logits_of(hidden[rows])  # [R, V]
        entries += compute_logprobs(logits, targets[begin:begin + MAX_ROWS], ks[begin:begin + MAX_ROWS])
    out, offset = {}, 0
    for j, first_scored, count in chunks:
        out[j] = (first_scored, entries[offset:offset + count])
        offset += count
    return out
