"""LogitsProcessors: the worker's per-request logits adjustments (penalties, bias, bad words,
allowed tokens), and the state they need, kept between steps.

Definitions are vLLM's (v1 sampler), applied in its order before temperature and the filters:
  1. allowed_token_ids: every other token -inf;
  2. bad words (and min_tokens' stop tokens, sampler.SamplingMetadata.banned): -inf;
  3. logit_bias: added (OpenAI's: token id -> bias in [-100, 100]);
  4. repetition_penalty r over the prompt and generated tokens: a logit > 0 is multiplied by
     1 / r, any other by r; then frequency_penalty f and presence_penalty p over the generated
     tokens only: logit -= f * count + p * (count > 0).

State: a request with penalties owns a slot of two [slots, V] tables on the model's device, the
counts of its generated tokens (int32) and the set of its prompt tokens (bool). Both are filled
when the worker registers the request (from all its token ids, so a request rescheduled after a
recompute preemption replays what it generated) and the counts are updated in place as its
tokens are sampled (on_sampled), never rebuilt from the history. A bad word of several tokens
bans its last token when the generated tokens end with the others (vLLM's rule), so it reads the
request's generated tokens, which the request table holds.

Requests without any of these hold nothing here, and a step where no row has any skips all of
it (for_step returns None): they pay one dict emptiness check per step.
"""
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from protocol.sampling import SamplingParams

Tokenize = Callable[[str], list[int]]


@dataclass
class StepAdjustments:
    """What one step applies, per sampled row i (aligned with the logits rows)."""

    allowed: list[tuple[int, torch.Tensor]]  # (i, allowed token ids)
    banned: list[tuple[int, list[int]]]  # (i, banned token ids): bad words
    bias_rows: torch.Tensor | None  # [N] row i of each biased entry
    bias_ids: torch.Tensor | None  # [N]
    bias_values: torch.Tensor | None  # [N] float32
    penalty_rows: torch.Tensor | None  # [P] rows i with penalties
    prompt_mask: torch.Tensor | None  # [P, V] bool
    output_counts: torch.Tensor | None  # [P, V] int32
    presence: torch.Tensor | None  # [P, 1]
    frequency: torch.Tensor | None  # [P, 1]
    repetition: torch.Tensor | None  # [P, 1]

    def apply(self, logits: torch.Tensor) -> None:
        """logits: [S, V] float32, in place."""
        for i, ids in self.allowed:
            keep = logits[i, ids]
            logits[i] = float("-inf")
            logits[i, ids] = keep
        for i, ids in self.banned:
            logits[i, ids] = float("-inf")
        if self.bias_rows is not None:
            logits.index_put_((self.bias_rows, self.bias_ids), self.bias_values, accumulate=True)
        if self.penalty_rows is not None:
            logits[self.penalty_rows] = apply_penalties(
                logits[self.penalty_rows], self.prompt_mask, self.output_counts, self.presence, self.frequency,
                self.repetition)


def apply_penalties(logits: torch.Tensor, prompt_mask: torch.Tensor, output_counts: torch.Tensor,
                    presence: torch.Tensor, frequency: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    """vLLM's apply_penalties. logits [P, V]; prompt_mask [P, V] bool; output_counts [P, V];
    presence, frequency, repetition [P, 1]."""
    output_mask = output_counts > 0
    penalties = torch.where(prompt_mask | output_mask, repetition, 1.0)
    logits = logits * torch.where(logits > 0, 1.0 / penalties, penalties)
    logits -= frequency * output_counts
    logits -= presence * output_mask
    return logits


def bad_words_token_ids(bad_words: list[str], tokenize: Tokenize) -> list[list[int]]:
    """vLLM's tokenization of bad words: each word as it is and with a leading space (a word in
    the middle of a text), the second kept only when it is a different token sequence of the
    same length."""
    out: list[list[int]] = []
    for word in bad_words:
        plain = tokenize(word.lstrip())
        if plain:
            out.append(plain)
        spaced = tokenize(" " + word.lstrip())
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            out.append(spaced)
    return out


class LogitsProcessors:
    def __init__(self, vocab_size: int, device: torch.device, tokenize: Tokenize | None):
        self.vocab_size, self.device, self.tokenize = vocab_size, device, tokenize
        self.allowed: dict[int, torch.Tensor] = {}  # row -> allowed ids
        self.bias: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # row -> (ids, values)
        self.bad_words: dict[int, list[list[int]]] = {}  # row -> token sequences
        self.slot_of: dict[int, int] = {}  # row -> penalty slot
        self._free_slots: list[int] = []
        self._num_slots = 0
        self.penalty_params = np.zeros((0, 3), dtype=np.float32)  # [slots, (presence, frequency, repetition)]
        self.output_counts = torch.zeros(0, vocab_size, dtype=torch.int32, device=device)
        self.prompt_mask = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)

    def add(self, row: int, params: SamplingParams, token_ids: list[int], num_prompt: int) -> None:
        """token_ids: the request's prompt, then what it generated before (a recompute)."""
        if params.allowed_token_ids is not None:
            self.allowed[row] = torch.tensor(params.allowed_token_ids, dtype=torch.int64, device=self.device)
        if params.logit_bias:
            self.bias[row] = (np.fromiter(params.logit_bias.keys(), dtype=np.int64),
                              np.fromiter(params.logit_bias.values(), dtype=np.float32))
        if params.bad_words:
            if self.tokenize is None:
                raise ValueError("bad_words need the model's tokenizer, and this model has none")
            self.bad_words[row] = bad_words_token_ids(params.bad_words, self.tokenize)
        if params.has_penalties:
            slot = self._take_slot()
            self.slot_of[row] = slot
            self.penalty_params[slot] = (params.presence_penalty, params.frequency_penalty, params.repetition_penalty)
            self.prompt_mask[slot] = False
            self.prompt_mask[slot, torch.tensor(token_ids[:num_prompt], dtype=torch.int64, device=self.device)] = True
            self.output_counts[slot] = torch.bincount(
                torch.tensor(token_ids[num_prompt:], dtype=torch.int64, device=self.device),
                minlength=self.vocab_size).to(torch.int32)

    def remove(self, rows: list[int]) -> None:
        if self.is_empty:
            return
        for row in rows:
            self.allowed.pop(row, None)
            self.bias.pop(row, None)
            self.bad_words.pop(row, None)
            slot = self.slot_of.pop(row, None)
            if slot is not None:
                self._free_slots.append(slot)

    def _take_slot(self) -> int:
        if not self._free_slots:
            new = max(8, 2 * self._num_slots)
            grow = new - self._num_slots
            self.penalty_params = np.concatenate([self.penalty_params, np.zeros((grow, 3), dtype=np.float32)])
            self.output_counts = torch.cat([self.output_counts, self.output_counts.new_zeros(grow, self.vocab_size)])
            self.prompt_mask = torch.cat([self.prompt_mask, self.prompt_mask.new_zeros(grow, self.vocab_size)])
            self._free_slots += range(new - 1, self._num_slots - 1, -1)
            self._num_slots = new
        return self._free_slots.pop()

    @property
    def is_empty(self) -> bool:
        return not (self.allowed or self.bias or self.bad_words or self.slot_of)

    def on_sampled(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """rows got tokens this step: count them for the rows with penalties, in place."""
        if not self.slot_of:
            return
        pairs = [(self.slot_of[r], t) for r, t in zip(rows.tolist(), tokens.tolist()) if r in self.slot_of]
        if pairs:
            index = torch.tensor(pairs, dtype=torch.int64, device=self.device).T  # [2, N]
            self.output_counts.index_put_((index[0], index[1]), torch.ones(len(pairs), dtype=torch.int32,
                                                                           device=self.device), accumulate=True)

    def for_step(self, rows: np.ndarray, generated: Callable[[int], np.ndarray]) -> StepAdjustments | None:
        """rows: the sampled rows in logits order; generated(row): its generated token ids."""
        if self.is_empty:
            return None
        row_list = rows.tolist()
        allowed = [(i, self.allowed[r]) for i, r in enumerate(row_list) if r in self.allowed]
        banned = self._banned_words(row_list, generated) if self.bad_words else []
        biased = [(i, self.bias[r]) for i, r in enumerate(row_list) if r in self.bias]
        penalised = [(i, self.slot_of[r]) for i, r in enumerate(row_list) if r in self.slot_of]
        if not (allowed or banned or biased or penalised):
            return None
        step = StepAdjustments(allowed, banned, *(None,) * 9)
        as_tensor = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        if biased:
            step.bias_rows = as_tensor(np.concatenate([np.full(len(ids), i) for i, (ids, _) in biased]))
            step.bias_ids = as_tensor(np.concatenate([ids for _, (ids, _) in biased]))
            step.bias_values = as_tensor(np.concatenate([values for _, (_, values) in biased]))
        if penalised:
            step.penalty_rows = torch.tensor([i for i, _ in penalised], device=self.device)
            slots = torch.tensor([s for _, s in penalised], device=self.device)
            step.prompt_mask, step.output_counts = self.prompt_mask[slots], self.output_counts[slots]
            params = as_tensor(self.penalty_params[[s for _, s in penalised]])  # [P, 3]
            step.presence, step.frequency, step.repetition = params[:, 0:1], params[:, 1:2], params[:, 2:3]
        return step

    def _banned_words(self, row_list: list[int], generated) -> list[tuple[int, list[int]]]:
        banned = []
        for i, row in enumerate(row_list):
            words = self.bad_words.get(row)
            if not words:
                continue
            past = generated(row)
            ids = [w[-1] for w in words
                   if len(w) == 1 or (len(past) >= len(w) - 1 and past[len(past) - len(w) + 1:].tolist() == w[:-1])]
            if ids:
                banned.append((i, ids))
        return banned
