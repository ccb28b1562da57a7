"""Rotary position embeddings (RoPE) as transformers computes them: one module for every family.

Chosen by config: the rope type and its parameters come from config.json's `rope_parameters`
(transformers 5) or `rope_scaling` (older folders), with `rope_theta`, `partial_rotary_factor`
and Phi-3's `original_max_position_embeddings` where a folder keeps them at the top level,
merged the way transformers' standardize_rope_params does. The inverse frequencies follow its
rope-init functions (transformers/modeling_rope_utils.py), the reference for each type:
default, linear, dynamic (NTK), llama3, yarn and longrope. Partial rotary
(`partial_rotary_factor`) turns the first rotary_dim features of each head and passes the rest.
A family with several bases (Gemma 3's local layers) builds one RotaryEmbedding per base from
its own parameters (rope_parameters(config, layer_type)).

Types with fixed frequencies (default, linear, llama3, yarn) precompute cos/sin per position.
Two depend on a sequence length at run time in transformers (its dynamic_rope_update):
- dynamic: inv_freq recomputed for seq_len = the forward's last position + 1 once that passes
  max_position_embeddings (a larger NTK base the longer the sequence);
- longrope: the long factors when seq_len > original_max_position_embeddings, else the short.
Here every token carries such a length, its "rope length" (the runner puts it in the forward
context, rope_lengths): what transformers used for that token when it generated that request
alone with its KV cache. It computes the prompt in one forward (each prompt token saw
seq_len = the prompt's length L) and each generated token in a forward of its own (seq_len =
its position + 1), so a token at position p gets max(L, p + 1). Taken from the request, not
from the step's chunk, this is exact however the prefill is chunked and across preemption by
recompute (the recomputed K/V equal the first ones). Phi-3 differs (length_anchor "sequence"):
its generate drops the cache when the sequence first passes original_max_position_embeddings
and recomputes every token with the long factors (Phi3ForCausalLM.prepare_inputs_for_generation),
so a Phi-3 token's rope length is its request's whole length after the step, and the runner
recomputes a request's K/V from token 0 in the step that crosses that length (recompute_past).
"""
import math

import torch
from torch import nn

from worker_svc.forward_context import get_forward_context
from worker_svc.models import ROPE_TYPES
_SCALED_TYPES = ("llama3", "yarn", "longrope")  # those that know an original_max_position_embeddings


def rope_parameters(config: dict, layer_type: str | None = None) -> dict:
    """config.json's rope settings as one dict (rope_type, rope_theta, partial_rotary_factor,
    the type's own keys), transformers' standardisation; layer_type picks a nested entry
    (transformers 5 keeps Gemma 3's per layer type)."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if layer_type is not None and isinstance(rope.get(layer_type), dict):
        rope = dict(rope[layer_type])
    rope.setdefault("rope_type", rope.get("type", "default"))
    rope.setdefault("rope_theta", config.get("rope_theta") or 10000.0)
    if config.get("partial_rotary_factor") is not None:
        rope.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    if rope["rope_type"] in ("su", "yarn") and config.get("model_type") == "phi3":
        rope["rope_type"] = "longrope"  # Phi3Config's renaming of old folders
    if rope["rope_type"] in _SCALED_TYPES:
        if config.get("original_max_position_embeddings") is not None:  # Phi-3 keeps it outside: it wins
            rope["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        rope.setdefault("original_max_position_embeddings", config.get("max_position_embeddings", 2048))
    if rope["rope_type"] not in ROPE_TYPES:
        raise NotImplementedError(f"rope type {rope['rope_type']!r} is not supported; supported: {ROPE_TYPES}")
    return rope


def max_model_len(config: dict) -> int:
    """The longest sequence a model serves by default, as vLLM derives it: linear and dynamic
    scaling stretch max_position_embeddings by their factor, yarn original_max_position_embeddings;
    llama3 and longrope folders already say their long length in max_position_embeddings."""
    max_positions = config.get("max_position_embeddings", 2048)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict) or "factor" not in rope:
        return max_positions
    rope_type = rope.get("rope_type", rope.get("type"))
    if rope_type in ("linear", "dynamic"):
        return int(max_positions * rope["factor"])
    if rope_type == "yarn" and config.get("model_type") != "phi3":
        return int(rope.get("original_max_position_embeddings", max_positions) * rope["factor"])
    return max_positions


def _base_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv_freq: torch.Tensor, rope: dict) -> torch.Tensor:
    factor, old_context_len = rope["factor"], rope["original_max_position_embeddings"]
    low_freq_factor, high_freq_factor = rope["low_freq_factor"], rope["high_freq_factor"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low_freq_factor, old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(base: float, dim: int, rope: dict, max_positions: int) -> tuple[torch.Tensor, float]:
    factor, original = rope.get("factor"), rope["original_max_position_embeddings"]
    if factor is None:
        factor = max_positions / original

    def get_mscale(scale, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(num_rotations):
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.get("beta_fast") or 32), correction_dim(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor, attention_factor


def _dynamic_inv_freqs(base: float, dim: int, factor: float, max_positions: int, num_rows: int) -> torch.Tensor:
    """Row i: inv_freq for seq_len = max_positions + i (row 0: the unscaled frequencies)."""
    seq_len = torch.arange(max_positions, max_positions + num_rows)[:, None]  # [R, 1] int64, as transformers' tensor
    scaled_base = base * ((factor * seq_len / max_positions) - (factor - 1)) ** (dim / (dim - 2))
    rows = 1.0 / (scaled_base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # [R, dim / 2]
    # seq_len <= max_position_embeddings: transformers' init-time frequencies, from Python floats
    rows[0] = 1.0 / ((base * ((factor * max_positions / max_positions) - (factor - 1)) ** (dim / (dim - 2))) ** (
        torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return rows


def _cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float):
    """positions: [P] float; inv_freq: [D/2] or [P, D/2] -> cos, sin [P, D] (transformers' order of ops)."""
    freqs = positions[:, None] * inv_freq  # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


@torch.library.custom_op("stepserve::rope_lengths", mutates_args=())
def rope_lengths(positions: torch.Tensor) -> torch.Tensor:
    """[T] -> each token's rope length (see the module docstring), from the forward context."""
    return get_forward_context().rope_lengths.clone()


@rope_lengths.register_fake
def _(positions):
    return torch.empty_like(positions)


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (rotate_half) over the first rotary_dim features of a head."""

    def __init__(self, rope: dict, head_dim: int, max_positions: int, dtype: torch.dtype,
                 config_max_position_embeddings: int | None = None, length_anchor: str = "prompt"):
        """rope: rope_parameters(...); max_positions: the longest sequence served (max_model_len);
        config_max_position_embeddings: config.json's max_position_embeddings (dynamic's and
        yarn's reference length; default max_positions); length_anchor: "prompt" (transformers'
        generic update) or "sequence" (Phi-3's recomputing generate)."""
        super().__init__()
        self.rope_type = rope["rope_type"]
        self.rotary_dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        self.length_anchor = length_anchor
        self.recompute_past = None  # a rope length past which a request's K/V are recomputed (Phi-3)
        base, dim = float(rope["rope_theta"]), self.rotary_dim
        config_max = config_max_position_embeddings or max_positions
        positions = torch.arange(max_positions).float()
        scaling, inv_freq = 1.0, _base_inv_freq(base, dim)
        if self.rope_type == "linear":
            inv_freq = inv_freq / rope["factor"]
        elif self.rope_type == "llama3":
            inv_freq = _llama3(inv_freq, rope)
        elif self.rope_type == "yarn":
            inv_freq, scaling = _yarn(base, dim, rope, config_max)
        self.uses_lengths = self.rope_type in ("dynamic", "longrope")
        if self.rope_type == "dynamic":
            # Frequencies per rope length from max_position_embeddings on; cos/sin per token at run time.
            self.dynamic_start = config_max
            num_rows = max(max_positions - config_max, 0) + 1
            self.register_buffer("inv_freqs", _dynamic_inv_freqs(base, dim, rope["factor"], config_max, num_rows),
                                 persistent=False)
            self.out_dtype = dtype
            return
        if self.rope_type == "longrope":
            self._init_longrope(rope, base, dim, positions, config_max, dtype)
            return
        cos, sin = _cos_sin(positions, inv_freq, scaling)
        self.register_buffer("cos", cos.to(dtype), persistent=False)  # [P, rotary_dim]
        self.register_buffer("sin", sin.to(dtype), persistent=False)

    def _init_longrope(self, rope, base, dim, positions, config_max, dtype):
        original = rope["original_max_position_embeddings"]
        factor = rope.get("factor") or config_max / original
        scaling = rope.get("attention_factor")
        if scaling is None:
            scaling = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        for name, factors in (("short", rope["short_factor"]), ("long", rope["long_factor"])):
            cos, sin = _cos_sin(positions, 1.0 / (torch.tensor(factors, dtype=torch.float32) * base ** shape), scaling)
            self.register_buffer(f"{name}_cos", cos.to(dtype), persistent=False)
            self.register_buffer(f"{name}_sin", sin.to(dtype), persistent=False)
        self.original_max = original
        if self.length_anchor == "sequence":
            self.recompute_past = original

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> cos, sin [T, rotary_dim] in the model's dtype."""
        if not self.uses_lengths:
            return self.cos[positions], self.sin[positions]
        lengths = rope_lengths(positions)  # [T]
        if self.rope_type == "longrope":
            long = (lengths > self.original_max)[:, None]
            return (torch.where(long, self.long_cos[positions], self.short_cos[positions]),
                    torch.where(long, self.long_sin[positions], self.short_sin[positions]))
        rows = (lengths.clamp(min=self.dynamic_start) - self.dynamic_start).clamp(max=self.inv_freqs.shape[0] - 1)
        cos, sin = _cos_sin(positions.float(), self.inv_freqs[rows], 1.0)
        return cos.to(self.out_dtype), sin.to(self.out_dtype)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions: [T]; q: [T, H, D], k: [T, Hkv, D] -> rotated q, k."""
        cos, sin = self.cos_sin(positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, rotary_dim]
        return _rotate(q, cos, sin, self.rotary_dim), _rotate(k, cos, sin, self.rotary_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_from_config(config: dict, head_dim: int, dtype: torch.dtype, layer_type: str | None = None,
                       length_anchor: str = "prompt") -> RotaryEmbedding:
    """The rotary embedding config.json describes, for max_model_len(config) positions."""
    return RotaryEmbedding(rope_parameters(config, layer_type), head_dim, max_model_len(config), dtype,
                           config_max_position_embeddings=config.get("max_position_embeddings"),
                           length_anchor=length_anchor)
