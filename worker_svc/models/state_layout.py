"""StateLayout: the packed sequences of a ForwardBatch regrouped for state-space layers.

A recurrence has to run token by token inside a sequence but can run in parallel across
sequences. So the batch is split into groups, each a padded [G, L] grid of token indices:

    decode group:  every sequence with query_len == 1  -> L == 1, one vectorised step
    prefill group: every sequence with query_len > 1   -> L == longest chunk, padded at the end

Decodes get a group of their own so that one long prefill chunk in the batch does not make
the decodes walk through L padded steps. Tokens sit left-aligned (step t of sequence g is
token start_g + t), so pads come after a sequence's last token and cannot touch its outputs;
the scan keeps its state through pads by giving them dt == 0 (exp(0 * A) == 1, no input).

Built once per forward and shared by every state layer.
"""
from dataclasses import dataclass

import torch

from worker_svc.forward_batch import ForwardBatch


@dataclass
class SeqGroup:
    token_index: torch.Tensor  # [G, L] int64, packed token index of step t of sequence g; pads: 0
    valid: torch.Tensor  # [G, L] bool, False on pads
    packed_index: torch.Tensor  # [n] int64, token_index[valid]: where the group's outputs go
    lens: torch.Tensor  # [G] int64, query_len of each sequence
    slots: torch.Tensor  # [G] int64, state slot of each sequence
    has_state: torch.Tensor  # [G] bool, False: the sequence starts from a zero state

    @property
    def max_len(self) -> int:
        return int(self.token_index.shape[1])

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[T, *F] packed -> [G, L, *F] padded; pad entries are zero."""
        padded = x[self.token_index]
        mask = self.valid.view(*self.valid.shape, *([1] * (x.dim() - 1)))
        return padded * mask.to(x.dtype)

    def scatter(self, padded: torch.Tensor, out: torch.Tensor) -> None:
        """Write [G, L, *F] padded results (pads dropped) into out [T, *F] in place."""
        out[self.packed_index] = padded[self.valid].to(out.dtype)

    def initial_state(self, state: torch.Tensor) -> torch.Tensor:
        """Rows of a per-slot state [num_slots, *S] -> [G, *S]; zeros where has_state is False.

        NOTE: zeroing here, not only when the runner allocates a slot, makes a fresh sequence
        (first chunk, or re-sent after a recompute preemption) independent of what its slot held.
        """
        rows = state[self.slots]
        mask = self.has_state.view(-1, *([1] * (state.dim() - 1)))
        return torch.where(mask, rows, torch.zeros((), dtype=rows.dtype))


@dataclass
class StateLayout:
    groups: list[SeqGroup]

    @classmethod
    def build(cls, batch: ForwardBatch) -> "StateLayout":
        assert batch.state_slots is not None, "a state-space model needs ForwardBatch.state_slots"
        query_lens = batch.query_lens
        decode = [i for i, n in enumerate(query_lens) if n == 1]
        prefill = [i for i, n in enumerate(query_lens) if n > 1]
        groups = [_group(batch, seqs) for seqs in (decode, prefill) if seqs]
        return cls(groups)


def _group(batch: ForwardBatch, seqs: list[int]) -> SeqGroup:
    device = batch.input_ids.device
    seq_index = torch.tensor(seqs, dtype=torch.int64, device=device)
    lens = torch.tensor([batch.query_lens[i] for i in seqs], dtype=torch.int64, device=device)
    computed = torch.tensor([batch.num_computed_tokens[i] for i in seqs], device=device)
    starts = batch.query_start_loc[seq_index]  # [G]
    steps = torch.arange(max(batch.query_lens[i] for i in seqs), device=device)  # [L]
    valid = steps[None, :] < lens[:, None]  # [G, L]
    token_index = torch.where(valid, starts[:, None] + steps[None, :], 0)  # [G, L]
    return SeqGroup(
        token_index=token_index,
        valid=valid,
        packed_index=token_index[valid],
        lens=lens,
        slots=batch.state_slots[seq_index].to(torch.int64),
        has_state=computed > 0,
    )
