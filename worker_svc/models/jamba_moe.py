"""Jamba's feed-forward blocks: a gated MLP, or a top-k mixture of such MLPs (experts).

Routing follows transformers' JambaSparseMoeBlock: softmax over all experts in float32, keep
the top k, do NOT renormalise the kept weights. Experts run one at a time over the tokens
routed to them, in expert order, accumulating with index_add_ like transformers, so float32
outputs match it to the last bits as closely as possible.

Expert weights are stored fused like transformers 5 (`experts.gate_up_proj` [E, 2I, H],
`experts.down_proj` [E, H, I]); checkpoints with per-expert `experts.{e}.gate_proj.weight`
etc. (what save_pretrained writes, and the published Jamba checkpoints) are sliced in by
`load_expert_weight`.
"""
import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.models.gated_mlp import GatedMLP
from worker_svc.models.layers import CheckpointMismatch, parameter
from worker_svc.parallel import TensorParallel


class JambaMLP(GatedMLP):
    """Jamba's dense feed-forward: the gated MLP, no bias, one rank."""

    def __init__(self, hidden_size: int, intermediate_size: int, dtype: torch.dtype):
        super().__init__(hidden_size, intermediate_size, False, dtype, TensorParallel())


class JambaRouter(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, dtype: torch.dtype):
        super().__init__()
        self.weight = parameter(num_experts, hidden_size, dtype=dtype)


class JambaExperts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, dtype: torch.dtype):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = parameter(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype)
        self.down_proj = parameter(num_experts, hidden_size, intermediate_size, dtype=dtype)

    def checkpoint_names(self, module_name: str, param_name: str) -> list[str]:
        """The per-expert checkpoint names that together cover a fused parameter."""
        projs = ("gate_proj", "up_proj") if param_name == "gate_up_proj" else ("down_proj",)
        return [f"{module_name}.{e}.{p}.weight" for e in range(len(self.down_proj)) for p in projs]


class JambaSparseMoe(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 dtype: torch.dtype):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.router = JambaRouter(hidden_size, num_experts, dtype)
        self.experts = JambaExperts(num_experts, hidden_size, intermediate_size, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        router_logits = F.linear(x, self.router.weight)  # [T, E]
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
        top_weights, top_experts = torch.topk(probs, self.top_k, dim=-1)  # [T, k] each
        top_weights = top_weights.to(x.dtype)
        out = torch.zeros_like(x)
        for expert in torch.unique(top_experts).tolist():  # sorted: same order as transformers
            token_idx, k_idx = torch.where(top_experts == expert)  # tokens routed to it
            gate, up = F.linear(x[token_idx], self.experts.gate_up_proj[expert]).chunk(2, -1)
            y = F.linear(F.silu(gate) * up, self.experts.down_proj[expert])  # [n, H]
            out.index_add_(0, token_idx, y * top_weights[token_idx, k_idx, None])
        return out


def load_expert_weight(moe: JambaSparseMoe, suffix: str, tensor: torch.Tensor) -> bool:
    """Copy a per-expert checkpoint tensor ('{e}.gate_proj.weight' etc., relative to
    `experts.`) into the fused parameters; False if `suffix` is not of that form."""
    parts = suffix.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or parts[2] != "weight":
        return False
    expert, proj, inter = int(parts[0]), parts[1], moe.experts.intermediate_size
    targets = {
        "gate_proj": moe.experts.gate_up_proj[expert, :inter],  # [I, H]
        "up_proj": moe.experts.gate_up_proj[expert, inter:],  # [I, H]
        "down_proj": moe.experts.down_proj[expert],  # [H, I]
    }
    if proj not in targets:
        return False
    target = targets[proj]
    if target.shape != tensor.shape:
        raise CheckpointMismatch(f"expert {expert} {proj}: checkpoint {tuple(tensor.shape)}, "
                                 f"model {tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(tensor.to(target.dtype))
    return True
