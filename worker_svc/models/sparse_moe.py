"""The sparse mixture-of-experts feed-forward block (Mixtral, Qwen3-MoE, Jamba): a router picks
k of E gated MLPs ("experts") per token and sums their outputs, weighted.

Routing, as transformers computes it for each family: router logits in the model's dtype,
softmax in float32 over all experts, the top k kept and, where the config says so, renormalised
to sum to 1 (Mixtral always; Qwen3-MoE when norm_topk_prob; Jamba never), then cast to the
model's dtype.

Experts are stacked per layer, as transformers 5 holds them in memory: `experts.gate_up_proj`
[E, 2I, H] (gate rows, then up rows) and `experts.down_proj` [E, H, I]. Checkpoints store them
either way: fused like that (a transformers 5 state dict) or one tensor per expert and
projection (`experts.{e}.gate_proj.weight` ..., what save_pretrained writes and the published
checkpoints hold); both load.

Tensor parallel (tp.size = N): like the dense GatedMLP, each rank holds I / N of every expert's
intermediate features (gate, up: rows; down: columns), so each computes a partial sum of the
block's output and one all_reduce per block completes it. The router is replicated: every rank
routes the same tokens to the same experts.

The experts run as one custom op, `stepserve::moe_experts`: the (token, expert) pairs sorted by
expert, each expert's two GEMMs over its own group of rows (torch's grouped_mm), the results
put back in pair order and summed per token. Which rows go to which expert depends on the data,
but the op's output ([T, H]) does not, so a compiled graph calls it as one opaque op (like
attention) and serves every routing with the graph compiled at warm-up. Measured on
tiny-mixtral's layer (H 256, I 688, E 8, k 2), float32, one thread, AMD EPYC (avx512f,
avx512_bf16), a host shared with other jobs (load 8-14 on 2 vCPUs), best of 5-15, ms per layer
at 8 / 64 / 512 / 2048 tokens:
- this op (grouped_mm):                                     3.9 / 6.7 / 19.1 / 71.2
- every expert over every token, masked by the routing
  weights (static shapes the compiler sees through):        4.6 / 10.7 / 64.1 / 495
- a loop over experts, torch.where per expert (transformers'
  eager path; data-dependent shapes, graph breaks):         3.2 / 5.0 / 22.9 / 119
The masked form is exact and compiles without an op, but costs E / k times the FLOPs (4x for
Mixtral-8x7B's shape, 7x slower here at 2,048 tokens), so it is not used. grouped_mm itself is
not traceable for float32 on CPU (inductor takes it for bfloat16 only): a second reason to keep
it inside the op.
"""
import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.models.layers import CheckpointMismatch, parameter
from worker_svc.parallel import TensorParallel

_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # per-expert checkpoint names


@torch.library.custom_op("stepserve::moe_experts", mutates_args=())
def moe_experts(x: torch.Tensor, top_experts: torch.Tensor, top_weights: torch.Tensor,
                gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> torch.Tensor:
    """x [T, H]; top_experts, top_weights [T, k]; gate_up_proj [E, 2I, H]; down_proj [E, H, I]
    -> sum over j of top_weights[t, j] * expert_{top_experts[t, j]}(x[t]), [T, H]."""
    num_tokens, top_k = top_experts.shape
    num_experts = gate_up_proj.shape[0]
    pair_experts = top_experts.reshape(-1)  # [T * k], pair p = (token p // k, choice p % k)
    order = torch.argsort(pair_experts, stable=True)  # pairs grouped by expert
    group_ends = torch.cumsum(torch.bincount(pair_experts, minlength=num_experts), 0, dtype=torch.int32)
    rows = x[order // top_k]  # [T * k, H]
    gate, up = F.grouped_mm(rows, gate_up_proj.transpose(1, 2), offs=group_ends).chunk(2, dim=-1)
    grouped = F.grouped_mm(F.silu(gate) * up, down_proj.transpose(1, 2), offs=group_ends)  # [T * k, H]
    per_pair = torch.empty_like(grouped)
    per_pair[order] = grouped  # back in pair order
    weighted = per_pair.view(num_tokens, top_k, -1) * top_weights.unsqueeze(-1)
    return weighted.sum(dim=1)  # [T, H]


@moe_experts.register_fake
def _(x, top_experts, top_weights, gate_up_proj, down_proj):
    return torch.empty_like(x)


class Router(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, top_k: int, renormalize: bool,
                 dtype: torch.dtype):
        super().__init__()
        self.weight = parameter(num_experts, hidden_size, dtype=dtype)
        self.top_k, self.renormalize = top_k, renormalize

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (expert ids [T, k], their weights [T, k] in x's dtype)."""
        probs = torch.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)  # [T, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)


class StackedExperts(nn.Module):
    """E gated MLPs (SiLU), this rank's intermediate features of each, in two stacked tensors."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, dtype: torch.dtype,
                 tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.intermediate_size = tp.divide(intermediate_size, "the experts' intermediate size")
        self.gate_up_proj = parameter(num_experts, 2 * self.intermediate_size, hidden_size, dtype=dtype)
        self.down_proj = parameter(num_experts, hidden_size, self.intermediate_size, dtype=dtype)

    @property
    def num_experts(self) -> int:
        return self.down_proj.shape[0]

    # Weight loading (worker_svc/loader.py and layers.load_hf_weights ask, as of a Linear).

    def full_shape(self, param_name: str) -> torch.Size:
        shape = list(getattr(self, param_name).shape)
        shape[1 if param_name == "gate_up_proj" else 2] *= self.tp.size
        return torch.Size(shape)

    def shard(self, param_name: str, full: torch.Tensor) -> torch.Tensor:
        """A full stacked tensor -> this rank's features: gate_up [E, 2I, H] -> gate_r | up_r."""
        if param_name == "gate_up_proj":
            return torch.cat([part.chunk(self.tp.size, dim=1)[self.tp.rank] for part in full.chunk(2, dim=1)], dim=1)
        return full.chunk(self.tp.size, dim=2)[self.tp.rank]  # down [E, H, I] -> [E, H, I / N]

    def checkpoint_names(self, module_name: str, param_name: str) -> list[str]:
        """The per-expert checkpoint names that together cover a stacked parameter."""
        projs = ("gate_proj", "up_proj") if param_name == "gate_up_proj" else ("down_proj",)
        return [f"{module_name}.{e}.{p}.weight" for e in range(self.num_experts) for p in projs]

    def load_expert_weight(self, suffix: str, tensor: torch.Tensor) -> bool:
        """Copy a per-expert checkpoint tensor ('{e}.gate_proj.weight' etc., relative to this
        module) into this rank's part of the stacked parameters; False if `suffix` is not one."""
        parts = suffix.split(".")
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in _PROJECTIONS or parts[2] != "weight":
            return False
        expert, proj, inter = int(parts[0]), parts[1], self.intermediate_size
        if proj == "down_proj":  # [H, I] -> [H, I / N]
            target, local = self.down_proj[expert], tensor.chunk(self.tp.size, dim=1)[self.tp.rank]
        else:  # [I, H] -> [I / N, H]
            start = 0 if proj == "gate_proj" else inter
            target, local = self.gate_up_proj[expert, start:start + inter], tensor.chunk(self.tp.size, dim=0)[self.tp.rank]
        if target.shape != local.shape:
            raise CheckpointMismatch(f"expert {expert} {proj}: checkpoint {tuple(tensor.shape)}, "
                                     f"model {tuple(target.shape)} on each of {self.tp.size} ranks")
        with torch.no_grad():
            target.copy_(local)
        return True


class SparseMoe(nn.Module):
    """Hugging Face names: `gate` (the router) and `experts`, as Mixtral and Qwen3-MoE have them
    (Jamba's `router` is renamed on load)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 renormalize: bool, dtype: torch.dtype, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.gate = Router(hidden_size, num_experts, top_k, renormalize, dtype)
        self.experts = StackedExperts(num_experts, hidden_size, intermediate_size, dtype, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        top_experts, top_weights = self.gate(x)
        out = moe_experts(x, top_experts, top_weights, self.experts.gate_up_proj, self.experts.down_proj)
        return self.tp.all_reduce(out)  # this rank's features: a partial sum
