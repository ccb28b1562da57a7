"""Which layers attend through a sliding window, and how wide, as config.json says.

transformers 5 writes `layer_types` ("sliding_attention" / "full_attention" per layer) and
`sliding_window`. Older folders say it otherwise, read here the way transformers reads them:
- Mistral: `sliding_window` alone (null: none), every layer windowed;
- Qwen2: `use_sliding_window` (false: none), windowed from layer `max_window_layers` on;
- Gemma 2 / Gemma 3: `sliding_window_pattern` P (Gemma 2: 2, Gemma 3: 6 when absent), layer i
  windowed unless (i + 1) % P == 0.
"""
SLIDING, FULL = "sliding_attention", "full_attention"


def layer_types(config: dict, default_pattern: int | None = None) -> list[str]:
    """Each layer's type; default_pattern: the family's sliding_window_pattern (None: every layer
    windowed when the config has a window)."""
    num_layers = config["num_hidden_layers"]
    if config.get("layer_types"):
        return list(config["layer_types"])
    if not config.get("sliding_window") or config.get("use_sliding_window") is False:
        return [FULL] * num_layers
    if "max_window_layers" in config:  # Qwen2
        return [SLIDING if i >= config["max_window_layers"] else FULL for i in range(num_layers)]
    pattern = config.get("sliding_window_pattern") or default_pattern
    if pattern is None:
        return [SLIDING] * num_layers
    return [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]


def sliding_windows(config: dict, default_pattern: int | None = None) -> list[int | None]:
    """Each layer's window for the attention op (None: global attention)."""
    window = config.get("sliding_window")
    if not window or config.get("use_sliding_window") is False:
        return [None] * config["num_hidden_layers"]
    return [int(window) if kind == SLIDING else None for kind in layer_types(config, default_pattern)]
