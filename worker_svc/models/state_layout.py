"""StateLayout: the packed sequences of a forward regrouped for state-space layers.

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

import numpy as np
import torch


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
    def build(cls, query_lens: np.ndarray, num_computed: np.ndarray, state_slots: np.ndarray,
              device: torch.device) -> "StateLayout":
        """Per sequence, in packed order: tokens this step, tokens computed before, state slot."""
        starts = np.cumsum(query_lens) - query_lens
        groups = []
        for seqs in (np.flatnonzero(query_lens == 1), np.flatnonzero(query_lens > 1)):
            if len(seqs):
                groups.append(_group(query_lens[seqs], starts[seqs], num_computed[seqs] > 0,
                                     state_slots[seqs], device))
        return cls(groups)


def _group(lens: np.ndarray, starts: np.ndarray, has_state: np.ndarray, slots: np.ndarray,
           device: torch.device) -> SeqGroup:
    steps = np.arange(int(lens.max()))  # [L]
    valid = steps[None, :] < lens[:, None]  # [G, L]
    token_index = np.where(valid, starts[:, None] + steps[None, :], 0)  # [G, L]

    def tensor(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    return SeqGroup(
        token_index=tensor(token_index.astype(np.int64)),
        valid=tensor(valid),
        packed_index=tensor(token_index[valid].astype(np.int64)),
        lens=tensor(lens.astype(np.int64)),
        slots=tensor(slots.astype(np.int64)),
        has_state=tensor(has_state),
    )
