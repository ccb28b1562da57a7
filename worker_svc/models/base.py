"""What every model offers the runner, and what memory it asks the runner to hold for it.

A model is built from a Hugging Face config.json dict (no transformers import at run time),
and every generative model class derives from CausalLM (below), which gives it the head and the
loading (HFModel, which the encoders of models/bert.py derive from too):

    model = ModelClass(config: dict, dtype: torch.dtype, tp: TensorParallel)
    model.cache_spec() -> CacheSpec
    model(input_ids, positions) -> hidden  # [T] int64 each -> [T, hidden_size]
    model.compute_logits(hidden)  # [S, hidden] -> [S, vocab] in the model's dtype (float32 where soft-capped)
    model.lm_head_weight  # [vocab, hidden]: compute_logits is hidden @ lm_head_weight.T
    model.load_weights(weights: Iterable[tuple[str, torch.Tensor]])  # Hugging Face names

The runner allocates the caches from the spec (CacheSpec and ModelCaches live with the cache, in
worker_svc/kv_cache.py): one paged KV tensor per attention layer and, for state-space layers,
one conv and one SSM state tensor per layer indexed by state slot. A forward reads them, and the
step's attention metadata and state layout, from the forward context
(worker_svc/forward_context.py) that the runner sets around the call.
"""
from collections.abc import Iterable

import torch
from torch import nn

from worker_svc.kv_cache import CacheSpec
from worker_svc.linear_kernel import linear, pack
from worker_svc.models.layers import load_hf_weights


class HFModel(nn.Module):
    """What every model class shares: Hugging Face weight loading through the one loader, told
    by class attributes how the checkpoint's names differ from ours."""

    supports_tensor_parallel = False  # True: built from the tensor-parallel layers
    supports_compile = False  # True: the runner may torch.compile its forward
    hf_prefixes: tuple[str, ...] = ("model.",)  # stripped from checkpoint names
    hf_skip: tuple[str, ...] = ()  # checkpoint names (substrings) that hold no parameter

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_hf_weights(self, weights, self.hf_prefixes, self.hf_skip, rename=self.hf_name,
                        load_special=self.load_special_weight)

    def hf_name(self, name: str) -> str:
        """A checkpoint name (prefix stripped) -> ours, where they differ otherwise."""
        return name

    def load_special_weight(self, name: str, tensor: torch.Tensor) -> str | None:
        """A tensor in a layout of the model's own: loads it and returns the name it covered
        (see load_hf_weights), or None if it is not one."""
        return None


class CausalLM(HFModel):
    """A generative model: the head (tied to the input embedding, or its own lm_head) and its
    KV cache. A subclass sets tie_word_embeddings."""

    input_embedding = "embed_tokens"  # the attribute whose weight a tied head shares
    tie_word_embeddings: bool
    # Logits become c * tanh(logits / c) (Gemma 2). The compiled greedy head (greedy_head.py)
    # takes the argmax of the uncapped logits: the cap is monotonic, so the argmax is the same.
    final_logit_softcapping: float | None = None

    def cache_spec(self) -> CacheSpec:
        """An attention-only model's: every layer's self_attn holds this rank's KV heads."""
        attn = self.layers[0].self_attn
        return CacheSpec(num_attention_layers=len(self.layers), num_kv_heads=attn.num_kv_heads,
                         head_dim=attn.head_dim)

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [vocab, hidden]
        if self.tie_word_embeddings:
            return getattr(self, self.input_embedding).weight
        return self.lm_head.weight

    def pack_weights(self) -> int:
        """A tied head's weight packed for the CPU's linear op (linear_kernel.pack_weights); a
        head of its own is a Linear, which packs itself."""
        if not self.tie_word_embeddings:
            return 0
        self.register_buffer("tied_head_packed", pack(self.lm_head_weight), persistent=False)
        return int(self.tied_head_packed is not None)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, hidden] -> [S, vocab] in the model's dtype, before any soft-capping."""
        packed = getattr(self, "tied_head_packed", None) if self.tie_word_embeddings else self.lm_head.packed_weight
        return linear(hidden, self.lm_head_weight, None, packed)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # [S, hidden] -> [S, vocab], left in the model's dtype: a float32 copy would hold the same
        # values, and the sampling kernel reads bfloat16 rows as they are (half the bytes).
        logits = self.head_logits(hidden)
        cap = self.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits.float() / cap) * cap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # A tied head is the embedding; a saved copy of it must equal it.
        skip = self.hf_skip + (("lm_head.",) if self.tie_word_embeddings else ())
        load_hf_weights(self, weights, self.hf_prefixes, skip, rename=self.hf_name,
                        load_special=self.load_special_weight)

    def load_special_weight(self, name: str, tensor: torch.Tensor) -> str | None:
        """A tensor in a layout of the model's own: loads it and returns the name it covered
        (see load_hf_weights), or None if it is not one. Here: one expert's projection
        (`...experts.{e}.gate_proj.weight`) into the stacked experts that hold it."""
        head, sep, suffix = name.partition(".experts.")
        try:
            experts = self.get_submodule(f"{head}.experts") if sep and head else None
        except AttributeError:  # no such module: an unexpected name
            return None
        if hasattr(experts, "load_expert_weight") and experts.load_expert_weight(suffix, tensor):
            return name
        return None
