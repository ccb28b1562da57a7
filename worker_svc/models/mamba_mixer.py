"""The Mamba (v1) selective state-space mixer over packed sequences, with per-slot state.

Shared by Mamba and Jamba (Jamba adds RMS norms on dt, B and C). Parameter names follow
Hugging Face's MambaMixer / JambaMambaMixer so load_weights can copy them by name.

State per sequence (rows of the runner's per-layer tensors, indexed by state slot):
    conv_state [num_slots, D, K]: the last K inputs of the causal conv (transformers keeps K;
                                  only the last K - 1 matter, the oldest column is shifted out)
    ssm_state  [num_slots, D, N]: the recurrent state h
A sequence with num_computed_tokens > 0 resumes from its slot (prefill chunk 2+, decode);
otherwise it starts from zeros. Both are written back in place after the step.

D = intermediate size (expand * hidden), N = d_state, K = d_conv, R = dt rank.
"""
import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.models.layers import Linear, RMSNorm, parameter
from worker_svc.models.state_layout import StateLayout

# The scan runs in float32 whatever the model dtype; keeping the carried state in float32 too
# means a prompt split into chunks rounds exactly like the same prompt in one piece.
STATE_DTYPE = torch.float32


class DepthwiseConvWeights(nn.Module):
    """The weights of Hugging Face's depthwise causal nn.Conv1d (weight [D, 1, K], bias [D]);
    the mixer applies them itself (MambaMixer._conv)."""

    def __init__(self, d_inner: int, d_conv: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = parameter(d_inner, 1, d_conv, dtype=dtype)
        self.bias = parameter(d_inner, dtype=dtype) if bias else None


class MambaMixer(nn.Module):
    def __init__(self, hidden_size: int, d_inner: int, d_state: int, d_conv: int, dt_rank: int,
                 conv_bias: bool, proj_bias: bool, dtype: torch.dtype, bcdt_norm_eps: float | None = None):
        super().__init__()
        self.d_inner, self.d_state, self.d_conv, self.dt_rank = d_inner, d_state, d_conv, dt_rank
        self.in_proj = Linear(hidden_size, 2 * d_inner, proj_bias, dtype)
        self.conv1d = DepthwiseConvWeights(d_inner, d_conv, conv_bias, dtype)
        self.x_proj = Linear(d_inner, dt_rank + 2 * d_state, False, dtype)
        self.dt_proj = Linear(dt_rank, d_inner, True, dtype)
        self.A_log = parameter(d_inner, d_state, dtype=dtype)
        self.D = parameter(d_inner, dtype=dtype)
        self.out_proj = Linear(d_inner, hidden_size, proj_bias, dtype)
        self.has_bcdt_norms = bcdt_norm_eps is not None
        if self.has_bcdt_norms:  # Jamba
            self.dt_layernorm = RMSNorm(dt_rank, bcdt_norm_eps, dtype)
            self.b_layernorm = RMSNorm(d_state, bcdt_norm_eps, dtype)
            self.c_layernorm = RMSNorm(d_state, bcdt_norm_eps, dtype)

    def forward(self, hidden: torch.Tensor, layout: StateLayout, conv_state: torch.Tensor,
                ssm_state: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] packed -> [T, H]; updates conv_state / ssm_state rows in place."""
        x, gate = self.in_proj(hidden).chunk(2, dim=-1)  # [T, D] each
        x = self._conv(x, layout, conv_state)  # [T, D]
        dt, B, C = torch.split(self.x_proj(x), [self.dt_rank, self.d_state, self.d_state], -1)
        if self.has_bcdt_norms:
            dt, B, C = self.dt_layernorm(dt), self.b_layernorm(B), self.c_layernorm(C)
        # dt [T, D] in float32: exp(dt * A) is where low precision hurts most.
        dt = F.softplus(dt @ self.dt_proj.weight.t() + self.dt_proj.bias.float())
        A = -torch.exp(self.A_log.float())  # [D, N]
        y = self._scan(x, dt, A, B, C, layout, ssm_state)  # [T, D] float32
        y = y + x * self.D
        y = y * F.silu(gate)
        return self.out_proj(y.to(hidden.dtype))

    def _conv(self, x: torch.Tensor, layout: StateLayout, conv_state: torch.Tensor):
        out = torch.empty_like(x)
        weight, bias, K = self.conv1d.weight, self.conv1d.bias, self.d_conv  # weight [D, 1, K]
        for group in layout.groups:
            G, D = group.lens.shape[0], self.d_inner
            xs = group.gather(x.float()).transpose(1, 2)  # [G, D, L]
            init = group.initial_state(conv_state).float()  # [G, D, K]
            window = torch.cat([init, xs], dim=-1)  # [G, D, K + L] float32
            # The last K real inputs of each sequence sit at columns lens .. lens + K - 1.
            cols = (group.lens[:, None] + torch.arange(K, device=x.device))  # [G, K]
            new_state = window.gather(2, cols[:, None, :].expand(G, D, K))  # [G, D, K]
            conv_state[group.slots] = new_state.to(conv_state.dtype)
            # The K inputs ending at step t are columns t + 1 .. t + K (window t + 1 of L + 1).
            # Multiply-and-sum in float32 rather than F.conv1d: CPU's depthwise conv1d in
            # bfloat16 took ~70 ms per call on tiny shapes.
            taps = window.unfold(2, K, 1)[:, :, 1:]  # [G, D, L, K]
            conv = (taps * weight.float().view(1, D, 1, K)).sum(-1)  # [G, D, L]
            if bias is not None:
                conv = conv + bias.float()[None, :, None]
            group.scatter(F.silu(conv.transpose(1, 2)), out)
        return out

    def _scan(self, x, dt, A, B, C, layout: StateLayout, ssm_state: torch.Tensor):
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)  # [T, D]
        for group in layout.groups:
            y, last = selective_scan(
                group.gather(x.float()), group.gather(dt), A,  # [G, L, D], pads: dt == 0
                group.gather(B.float()), group.gather(C.float()),  # [G, L, N]
                group.initial_state(ssm_state).float())  # [G, D, N]
            ssm_state[group.slots] = last.to(ssm_state.dtype)
            group.scatter(y, out)
        return out


def selective_scan(x, dt, A, B, C, state):
    """h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t ; y_t = h_t C_t  (D skip and gate excluded).

    x, dt [G, L, D]; A [D, N]; B, C [G, L, N]; state [G, D, N] -> y [G, L, D], last [G, D, N].
    A sequential loop over L (fine for decode, L == 1, and tiny prefill chunks), vectorised
    over the G sequences.
    """
    dA = torch.exp(dt[..., None] * A)  # [G, L, D, N]
    dBx = dt[..., None] * B[:, :, None, :] * x[..., None]  # [G, L, D, N]
    ys = []
    for t in range(x.shape[1]):
        state = dA[:, t] * state + dBx[:, t]  # [G, D, N]
        ys.append(torch.matmul(state, C[:, t, :, None])[..., 0])  # [G, D]
    return torch.stack(ys, dim=1), state

