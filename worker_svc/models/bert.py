"""Encoders: BERT and (XLM-)RoBERTa, as embedders (BertModel: all-MiniLM-L6-v2, bge-small;
XLMRobertaModel: bge-m3) and as cross-encoders (...ForSequenceClassification: bge-reranker).

One encoder, options read from config.json: RoBERTa's position ids start at pad_token_id + 1
(position_offset), hidden_act, layer_norm_eps, type_vocab_size. Post-norm layers: attention,
residual, LayerNorm; MLP, residual, LayerNorm. Attention is bidirectional within each sequence
of the packed token batch (encoder_attention.py), and keeps no KV cache (cache_spec: no layers).

The classifier head is one shape for both: dense + tanh on the first token, then a projection
to the labels: BERT's pooler.dense and classifier, RoBERTa's classifier.dense and
classifier.out_proj (renamed on load). An embedder has no head: a checkpoint's pooler (BertModel
saves one; sentence-transformers never uses it) is skipped.

No tensor parallelism: these models are small; replicas scale them.
"""
import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.encoder_attention import encoder_attention
from worker_svc.forward_context import get_forward_context
from worker_svc.kv_cache import CacheSpec
from worker_svc.models.base import HFModel
from worker_svc.models.layers import Embedding, Linear, parameter
from worker_svc.parallel import TensorParallel

_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}
_ROBERTA_TYPES = ("roberta", "xlm-roberta")

# Checkpoint names (prefix stripped) -> ours, in order; the first match of each kind applies.
_RENAMES = (
    ("encoder.layer.", "layers."),
    (".attention.self.query.", ".q_proj."), (".attention.self.key.", ".k_proj."),
    (".attention.self.value.", ".v_proj."), (".attention.output.dense.", ".o_proj."),
    (".attention.output.LayerNorm.", ".attn_norm."), (".intermediate.dense.", ".up_proj."),
    (".output.dense.", ".down_proj."), (".output.LayerNorm.", ".mlp_norm."),
    ("embeddings.LayerNorm.", "embed_norm."), ("embeddings.", ""),
    ("classifier.dense.", "head_dense."), ("classifier.out_proj.", "head_out."),  # RoBERTa's
    ("classifier.", "head_out."),
)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight, self.bias = parameter(dim, dtype=dtype), parameter(dim, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


@torch.library.custom_op("stepserve::token_type_ids", mutates_args=())
def token_type_ids(positions: torch.Tensor) -> torch.Tensor:
    """[T] int64: the forward context's segment id of each token, zeros where it sets none."""
    ids = get_forward_context().token_type_ids
    return torch.zeros_like(positions) if ids is None else ids.clone()


@token_type_ids.register_fake
def _(positions):
    return torch.empty_like(positions)


class EncoderLayer(nn.Module):
    def __init__(self, config: dict, dtype: torch.dtype):
        super().__init__()
        hidden = config["hidden_size"]
        self.num_heads = config["num_attention_heads"]
        self.head_dim = hidden // self.num_heads
        eps = config.get("layer_norm_eps", 1e-12)
        self.qkv_proj = Linear(hidden, 3 * hidden, True, dtype, shard_sizes=(hidden, hidden, hidden))
        self.o_proj = Linear(hidden, hidden, True, dtype)
        self.attn_norm = LayerNorm(hidden, eps, dtype)
        self.up_proj = Linear(hidden, config["intermediate_size"], True, dtype)
        self.down_proj = Linear(config["intermediate_size"], hidden, True, dtype)
        self.mlp_norm = LayerNorm(hidden, eps, dtype)
        act = config.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise NotImplementedError(f"hidden_act {act!r}")
        self.act = _ACTIVATIONS[act]
        self.scale = self.head_dim ** -0.5

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        num_tokens = h.shape[0]
        q, k, v = (x.view(num_tokens, self.num_heads, self.head_dim)
                   for x in self.qkv_proj(h).split(self.qkv_proj.shard_sizes, dim=-1))  # [T, H, D]
        h = self.attn_norm(h + self.o_proj(encoder_attention(q, k, v, self.scale)))
        return self.mlp_norm(h + self.down_proj(self.act(self.up_proj(h))))


class BertModel(HFModel):
    """The encoder: model(input_ids, positions) -> hidden [T, hidden], the last layer's output
    (sentence-transformers' token embeddings). An embedder."""

    supports_compile = True
    bidirectional = True
    hf_prefixes = ("bert.", "roberta.")
    hf_skip = ("position_ids", "unused.", "lm_head.", "cls.")  # cls.: BertForMaskedLM's head
    uses_pooler = False  # BERT's classifier: its pooler.dense is the head's dense

    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel = TensorParallel()):
        super().__init__()
        self.config = config
        hidden = config["hidden_size"]
        # RoBERTa numbers positions from pad_token_id + 1 (its padding_idx is the pad token).
        roberta = config.get("model_type") in _ROBERTA_TYPES
        self.position_offset = config.get("pad_token_id", 1) + 1 if roberta else 0
        self.max_positions = config["max_position_embeddings"] - self.position_offset
        self.word_embeddings = Embedding(config["vocab_size"], hidden, dtype)
        self.position_embeddings = Embedding(config["max_position_embeddings"], hidden, dtype)
        self.type_vocab_size = config.get("type_vocab_size", 2)
        self.token_type_embeddings = Embedding(self.type_vocab_size, hidden, dtype)
        self.embed_norm = LayerNorm(hidden, config.get("layer_norm_eps", 1e-12), dtype)
        self.layers = nn.ModuleList(EncoderLayer(config, dtype) for _ in range(config["num_hidden_layers"]))

    def cache_spec(self) -> CacheSpec:
        return CacheSpec(num_attention_layers=0, num_kv_heads=0, head_dim=0)

    def hf_name(self, name: str) -> str:
        name = name.replace(".gamma", ".weight").replace(".beta", ".bias")  # TF-era checkpoints
        if name.startswith("pooler."):
            return name.replace("pooler.dense.", "head_dense.") if self.uses_pooler else "unused." + name
        for old, new in _RENAMES:
            if old in name:
                name = name.replace(old, new, 1)
                if old != "encoder.layer.":
                    break
        return name

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = (self.word_embeddings(input_ids) + self.position_embeddings(positions + self.position_offset)
             + self.token_type_embeddings(token_type_ids(positions)))  # [T, hidden]
        h = self.embed_norm(h)
        for layer in self.layers:
            h = layer(h)
        return h


class BertForSequenceClassification(BertModel):
    """The encoder and the classifier head (module docstring): classify(first tokens) -> logits."""

    def __init__(self, config: dict, dtype: torch.dtype, tp: TensorParallel = TensorParallel()):
        super().__init__(config, dtype, tp)
        self.uses_pooler = config.get("model_type") not in _ROBERTA_TYPES
        hidden = config["hidden_size"]
        self.head_dense = Linear(hidden, hidden, True, dtype)
        self.head_out = Linear(hidden, num_labels(config), True, dtype)

    def classify(self, first_tokens: torch.Tensor) -> torch.Tensor:
        """[B, hidden] hidden states of each sequence's first token -> logits [B, num_labels]."""
        return self.head_out(torch.tanh(self.head_dense(first_tokens)))


def num_labels(config: dict) -> int:
    """transformers' rule: id2label's length, else num_labels, else 2."""
    return len(config.get("id2label") or {}) or config.get("num_labels", 2)
