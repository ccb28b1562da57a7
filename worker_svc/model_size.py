"""How big a model is: the bytes of its weights, read without torch (and without loading it).

The one measure of a small model. Two rules take it, each with its own threshold, because they
answer different questions and were measured apart:
- worker_svc/cpu_threads.py: does one torch thread run a worker's step faster than several?
- stepserve/default_replicas.py: do one-thread replicas, one per core, serve more than one
  replica with every core's threads? (tiny-llama is too large for the first, small for the
  second.)
The launcher asks before any worker, or torch, has started: hence files and configs, not a
loaded model.
"""
import os

from worker_svc import presets

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_bytes(model: str) -> int:
    """The bytes of a model folder's weight files, or of a preset's float32 weights; 0 for a
    name that is neither (not a model the worker knows: it says so itself)."""
    if not os.path.isdir(model):
        return _preset_weight_bytes(model)
    return sum(entry.stat().st_size for entry in os.scandir(model)
               if entry.is_file() and entry.name.endswith(_WEIGHT_SUFFIXES))


def _preset_weight_bytes(name: str) -> int:
    """A preset's float32 weights, counted from its config: the embedding and the head, and per
    layer the attention's four matrices and the MLP's (or each expert's) three."""
    if not presets.is_preset(name):
        return 0
    config = presets.preset_config(name)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    mlp = config.get("intermediate_size") or config.get("ffn_dim") or 4 * hidden
    per_layer = 4 * hidden * hidden + 3 * hidden * mlp * config.get("num_local_experts", 1)
    return 4 * (2 * vocab * hidden + config["num_hidden_layers"] * per_layer)
