"""Pooler: a step's pooling requests' hidden states -> each request's vector, as float32 bytes.

Each pooling request's prompt lies whole on the step's token axis (start, length). Its vector:
1. the pooled hidden state: its first token (CLS), its last (LAST), or the mean of all (MEAN),
   in float32, as sentence-transformers' Pooling module computes them;
2. classify: the model's classifier head (model.classify) on it, then softmax over the labels
   (sigmoid for one label) unless the request turns activation off;
3. embed: the first `dimensions` values (Matryoshka), then L2-normalised if the request (or,
   unset, the model: PoolingInfo.normalize) says so, as sentence-transformers' Normalize module.
"""
import numpy as np
import torch
import torch.nn.functional as F

from protocol.pooling import PoolingInfo, PoolingParams


class Pooler:
    def __init__(self, info: PoolingInfo, model: torch.nn.Module):
        self.info, self.model = info, model

    def pool(self, hidden: torch.Tensor, starts: np.ndarray, lens: np.ndarray,
             params: list[PoolingParams]) -> tuple[list[bytes | None], dict[int, str]]:
        """hidden [T, hidden]; starts, lens [B]: each request's tokens on the token axis ->
        per request its float32 little-endian vector, or None and a reason (index -> str) for a
        request that cannot have one."""
        pooled = self._pooled_states(hidden, starts, lens)  # [B, hidden] float32
        if self.info.task == "classify":
            return self._classified(pooled.to(hidden.dtype), params), {}
        vectors, errors = [], {}
        rows = pooled.cpu().numpy()
        for i, (row, p) in enumerate(zip(rows, params)):
            if p.dimensions is not None and p.dimensions > len(row):
                errors[i] = f"dimensions {p.dimensions} > the model's embedding size {len(row)}"
                vectors.append(None)
                continue
            row = row[:p.dimensions]
            if self.info.normalize if p.normalize is None else p.normalize:
                row = row / max(float(np.linalg.norm(row)), 1e-12)  # F.normalize's eps
            vectors.append(row.astype("<f4").tobytes())
        return vectors, errors

    def _pooled_states(self, hidden: torch.Tensor, starts: np.ndarray, lens: np.ndarray) -> torch.Tensor:
        kind = self.info.pooling_type
        if kind in ("CLS", "LAST"):
            index = starts if kind == "CLS" else starts + lens - 1
            return hidden[torch.from_numpy(index).to(hidden.device)].float()
        seq_of_token = np.repeat(np.arange(len(lens)), lens)
        tokens = np.repeat(starts, lens) + np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        sums = hidden.new_zeros(len(lens), hidden.shape[1], dtype=torch.float32).index_add_(
            0, torch.from_numpy(seq_of_token).to(hidden.device),
            hidden[torch.from_numpy(tokens).to(hidden.device)].float())
        return sums / torch.from_numpy(lens).to(sums)[:, None]

    def _classified(self, pooled: torch.Tensor, params: list[PoolingParams]) -> list[bytes]:
        logits = self.model.classify(pooled).float()  # [B, num_labels]
        probs = torch.sigmoid(logits) if logits.shape[1] == 1 else F.softmax(logits, dim=-1)
        activated = torch.tensor([p.activation for p in params], device=logits.device)[:, None]
        rows = torch.where(activated, probs, logits).cpu().numpy().astype("<f4")
        return [row.tobytes() for row in rows]
