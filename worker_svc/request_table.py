"""RequestTable: the worker's per-request state, one row per request in preallocated numpy arrays.

Rows make a step's input preparation a few vectorised gathers over the scheduled rows. Arrays
grow by doubling when more requests are held than rows exist; rows are reused via a free list.
"""
from dataclasses import dataclass
from itertools import chain, repeat

import numpy as np

from protocol.pooling import PoolingParams
from protocol.worker_messages import NewRequestData
from worker_svc.kv_cache import num_blocks_for_tokens
from worker_svc.logits_processors import LogitsProcessors
from worker_svc.sampler import SamplingMetadata
from worker_svc.structured_outputs import StructuredOutputs


@dataclass
class StepInputs:
    """One forward's inputs: per sequence [B], and per token [T] (padded past the real tokens:
    token 0 at position 0, stored to a scratch slot)."""

    num_computed_tokens: np.ndarray  # [B] before this step
    input_ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    slot_mapping: np.ndarray  # [T]
    block_tables: np.ndarray  # [B, max_blocks], trimmed to the longest context
    sampled_mask: np.ndarray  # [B] bool: the sequence reaches the end of its known tokens
    logits_indices: np.ndarray  # [S] last token of each sampled sequence
    # [B] bool: a pooling request's whole prompt (it ends with this step, sampling nothing)
    pooled_mask: np.ndarray
    query_start_loc: np.ndarray  # [B + 1] where each sequence's tokens start on the token axis

    @classmethod
    def empty(cls, num_padded: int, scratch_slot: int = 0) -> "StepInputs":
        """No sequences, num_padded padding tokens: a warm-up forward."""
        none = np.zeros(0, dtype=np.int64)
        zeros = np.zeros(num_padded, dtype=np.int64)
        return cls(num_computed_tokens=none, input_ids=zeros, positions=zeros,
                   slot_mapping=np.full(num_padded, scratch_slot, dtype=np.int64),
                   block_tables=np.zeros((0, 1), dtype=np.int64),
                   sampled_mask=np.zeros(0, dtype=bool), logits_indices=none,
                   pooled_mask=np.zeros(0, dtype=bool), query_start_loc=np.zeros(1, dtype=np.int64))


class RequestTable:
    def __init__(self, max_model_len: int, block_size: int, eos_token_ids: list[int],
                 logits_processors: LogitsProcessors, structured_outputs: StructuredOutputs,
                 uses_blocks: bool = True, num_rows: int = 64):
        # Per-request state of the sampler, keyed by the rows of this table.
        self.logits_processors = logits_processors  # penalties, bias, bad words, allowed tokens
        self.structured_outputs = structured_outputs  # grammar matchers
        self.max_model_len, self.block_size = max_model_len, block_size
        self.uses_blocks = uses_blocks  # False for pure state-space models: no KV, no blocks
        self.eos_token_ids = list(eos_token_ids)
        self.max_blocks = num_blocks_for_tokens(max_model_len, block_size)
        self.row_of: dict[str, int] = {}
        self.stop_ids: dict[int, list[int]] = {}  # row -> tokens banned before min_tokens
        self.scoring_rows: set[int] = set()  # rows asking for prompt logprobs
        self.pooling: dict[int, PoolingParams] = {}  # row -> a pooling request's parameters
        self._free_rows: list[int] = []
        self.num_rows = 0
        self._grow(num_rows)

    def _grow(self, num_rows: int) -> None:
        def resized(name: str, shape: tuple, dtype, fill=0):
            new = np.full(shape, fill, dtype=dtype)
            if self.num_rows:
                new[:self.num_rows] = getattr(self, name)
            setattr(self, name, new)

        # +1 column: the token sampled at max_model_len is stored, then the request finishes.
        resized("token_ids", (num_rows, self.max_model_len + 1), np.int64)
        resized("block_table", (num_rows, self.max_blocks), np.int64)
        for name in ("num_tokens", "num_computed", "num_prompt", "num_blocks", "min_tokens",
                     "top_k", "state_slot"):
            resized(name, (num_rows,), np.int64)
        resized("seed", (num_rows,), np.int64, -1)
        resized("is_pooling", (num_rows,), bool)
        resized("num_logprobs", (num_rows,), np.int64, -1)
        resized("num_prompt_logprobs", (num_rows,), np.int64, -1)
        for name in ("temperature", "top_p", "min_p"):
            resized(name, (num_rows,), np.float32)
        self._free_rows += range(num_rows - 1, self.num_rows - 1, -1)
        self.num_rows = num_rows

    # ---- membership ----------------------------------------------------------------------
    # A plan registers, frees and extends requests by the hundred: each is one call over all of
    # them, numpy scatters of the plan's lists rather than a Python loop of numpy scalar writes.
    # Only what few requests ask for (logprobs, min_tokens, penalties, grammars) is per request.

    def add(self, news: list[NewRequestData]) -> np.ndarray:
        """Registers requests the table does not hold: their rows, in order. All or none."""
        count = len(news)
        if not count:
            return np.zeros(0, dtype=np.int64)
        ids = [new.request_id for new in news]
        assert not any(map(self.row_of.__contains__, ids)), "a request is already held"
        token_lists = [new.token_ids for new in news]
        num_tokens = np.fromiter(map(len, token_lists), np.int64, count)
        if num_tokens.max() > self.max_model_len:
            i = int(num_tokens.argmax())
            raise ValueError(f"{ids[i]}: {num_tokens[i]} tokens > max_model_len {self.max_model_len}")
        while len(self._free_rows) < count:
            self._grow(2 * self.num_rows)
        row_list = self._free_rows[:-count - 1:-1]  # taken from the end, as pop() would
        del self._free_rows[len(self._free_rows) - count:]
        rows = np.array(row_list, dtype=np.int64)
        self.row_of.update(zip(ids, row_list))
        try:
            self.token_ids[np.repeat(rows, num_tokens), _ragged_arange(num_tokens)] = np.fromiter(
                chain.from_iterable(token_lists), np.int64, int(num_tokens.sum()))
            self.num_tokens[rows] = num_tokens
            self.num_computed[rows] = [new.num_computed_tokens for new in news]
            self.num_prompt[rows] = [new.num_prompt_tokens for new in news]
            self.num_blocks[rows] = 0
            self.append_blocks(rows, [new.block_ids for new in news])
            params = [new.params for new in news]
            self.temperature[rows] = [p.temperature for p in params]
            self.top_k[rows] = [max(p.top_k, 0) for p in params]
            self.top_p[rows] = [p.top_p for p in params]
            self.min_p[rows] = [p.min_p for p in params]
            self.seed[rows] = [-1 if p.seed is None else p.seed for p in params]
            self.num_logprobs[rows] = [-1 if p.logprobs is None else p.logprobs for p in params]
            self.num_prompt_logprobs[rows] = [-1 if p.prompt_logprobs is None else p.prompt_logprobs for p in params]
            self.min_tokens[rows] = [p.min_tokens for p in params]
            self.is_pooling[rows] = [new.pooling is not None for new in news]
            for row, new in zip(row_list, news):
                p = new.params
                if new.pooling is not None:
                    self.pooling[row] = new.pooling
                if p.prompt_logprobs is not None:
                    self.scoring_rows.add(row)
                if p.min_tokens:
                    self.stop_ids[row] = list(p.stop_token_ids or ()) + ([] if p.ignore_eos else self.eos_token_ids)
                self.logits_processors.add(row, p, new.token_ids, new.num_prompt_tokens)
                self.structured_outputs.add(row, p.structured_outputs, new.token_ids, new.num_prompt_tokens)
        except Exception:
            self.remove(ids)
            raise
        return rows

    def rows_of(self, request_ids) -> np.ndarray:
        """The rows of held requests (KeyError for one not held)."""
        return np.fromiter(map(self.row_of.__getitem__, request_ids), np.int64)

    def remove(self, request_ids) -> None:
        """Forgets these requests; ids not held are ignored."""
        rows = [row for row in map(self.row_of.pop, request_ids, repeat(None)) if row is not None]
        if not rows:
            return
        if self.stop_ids:
            for row in rows:
                self.stop_ids.pop(row, None)
        self.scoring_rows.difference_update(rows)
        if self.pooling:
            for row in rows:
                self.pooling.pop(row, None)
        self.logits_processors.remove(rows)
        self.structured_outputs.remove(rows)
        self._free_rows += rows

    def append_blocks(self, rows: np.ndarray, block_lists: list[list[int]]) -> None:
        """Appends block_lists[i] to the block table of rows[i] (distinct rows)."""
        counts = np.fromiter(map(len, block_lists), np.int64, len(block_lists))
        if not counts.any():
            return
        start = self.num_blocks[rows]
        if (start + counts > self.max_blocks).any():
            raise ValueError(f"more than {self.max_blocks} blocks for one request")
        self.block_table[np.repeat(rows, counts), np.repeat(start, counts) + _ragged_arange(counts)] = np.fromiter(
            chain.from_iterable(block_lists), np.int64, int(counts.sum()))
        self.num_blocks[rows] = start + counts

    @property
    def num_requests(self) -> int:
        return len(self.row_of)

    @property
    def num_blocks_in_use(self) -> int:
        rows = list(self.row_of.values())
        return int(self.num_blocks[rows].sum()) if rows else 0

    # ---- one step ------------------------------------------------------------------------

    def prepare_inputs(self, rows: np.ndarray, query_lens: np.ndarray, num_padded: int,
                       scratch_slot: int) -> StepInputs:
        """The inputs of rows computing query_lens tokens each, on a token axis of num_padded."""
        bs = self.block_size
        num_computed = self.num_computed[rows]
        context_lens = num_computed + query_lens
        if (context_lens > self.num_tokens[rows]).any():
            raise ValueError("a plan computes tokens the worker does not have")
        if self.uses_blocks and (num_blocks_for_tokens(context_lens, bs) > self.num_blocks[rows]).any():
            raise ValueError("a plan computes tokens past a request's blocks")
        query_start_loc = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        if len(rows) == int(query_start_loc[-1]):  # decode only: one token per sequence
            token_rows, positions = rows, num_computed
        else:
            token_rows = np.repeat(rows, query_lens)
            positions = (np.arange(query_start_loc[-1])
                         - np.repeat(query_start_loc[:-1] - num_computed, query_lens))
        num_tokens = int(query_start_loc[-1])
        input_ids = np.zeros(num_padded, dtype=np.int64)
        input_ids[:num_tokens] = self.token_ids[token_rows, positions]
        slot_mapping = np.full(num_padded, scratch_slot, dtype=np.int64)
        slot_mapping[:num_tokens] = self.block_table[token_rows, positions // bs] * bs + positions % bs
        padded_positions = np.zeros(num_padded, dtype=np.int64)
        padded_positions[:num_tokens] = positions
        max_blocks = int(num_blocks_for_tokens(context_lens.max(), bs))
        reaches_end = context_lens == self.num_tokens[rows]
        pooled_mask = self.is_pooling[rows]
        if (pooled_mask & ((num_computed > 0) | ~reaches_end)).any():
            raise ValueError("a pooling request's prompt must run whole in one step")
        sampled_mask = reaches_end & ~pooled_mask
        return StepInputs(
            num_computed_tokens=num_computed, input_ids=input_ids, positions=padded_positions,
            slot_mapping=slot_mapping, block_tables=self.block_table[rows, :max_blocks],
            sampled_mask=sampled_mask, logits_indices=query_start_loc[1:][sampled_mask] - 1,
            pooled_mask=pooled_mask, query_start_loc=query_start_loc)

    def sampling_metadata(self, rows: np.ndarray) -> SamplingMetadata:
        num_generated = self.num_tokens[rows] - self.num_prompt[rows]
        banned = []
        if self.stop_ids:
            for i in np.flatnonzero(self.min_tokens[rows] > num_generated).tolist():
                banned.append((i, self.stop_ids[int(rows[i])]))
        adjustments = self.logits_processors.for_step(rows, self.generated_token_ids)
        return SamplingMetadata(
            temperature=self.temperature[rows], top_k=self.top_k[rows], top_p=self.top_p[rows],
            min_p=self.min_p[rows], seed=self.seed[rows], num_generated=num_generated,
            num_logprobs=self.num_logprobs[rows], banned=banned, adjustments=adjustments,
            grammar=self.structured_outputs.for_step(rows))

    def generated_token_ids(self, row: int) -> np.ndarray:
        return self.token_ids[row, self.num_prompt[row]:self.num_tokens[row]]

    def advance(self, rows: np.ndarray, query_lens: np.ndarray, sampled_rows: np.ndarray,
                tokens: np.ndarray) -> None:
        self.num_computed[rows] += query_lens
        self.token_ids[sampled_rows, self.num_tokens[sampled_rows]] = tokens
        self.num_tokens[sampled_rows] += 1
        self.logits_processors.on_sampled(sampled_rows, tokens)
        self.structured_outputs.on_sampled(sampled_rows, tokens)


def _ragged_arange(lengths: np.ndarray) -> np.ndarray:
    """0..lengths[0]-1, 0..lengths[1]-1, ... concatenated."""
    ends = np.cumsum(lengths)
    return np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - lengths, lengths)
