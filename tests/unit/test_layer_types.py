"""Which layers are windowed, read from config.json the way transformers reads each family's."""
from worker_svc.models.layer_types import sliding_windows


def test_layer_types_as_transformers_5_writes_them():
    config = {"num_hidden_layers": 3, "sliding_window": 8,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
    assert sliding_windows(config) == [8, None, 8]


def test_older_folders_mistral_qwen2_and_gemma_patterns():
    mistral = {"num_hidden_layers": 2, "sliding_window": 16}
    assert sliding_windows(mistral) == [16, 16]
    assert sliding_windows({**mistral, "sliding_window": None}) == [None, None]
    qwen2 = {"num_hidden_layers": 3, "sliding_window": 32, "max_window_layers": 1}
    assert sliding_windows({**qwen2, "use_sliding_window": False}) == [None] * 3
    assert sliding_windows({**qwen2, "use_sliding_window": True}) == [None, 32, 32]
    gemma3 = {"num_hidden_layers": 7, "sliding_window": 4}
    assert sliding_windows(gemma3, default_pattern=6) == [4] * 5 + [None, 4]
    assert sliding_windows({**gemma3, "sliding_window_pattern": 2}, 6) == [4, None, 4, None, 4, None, 4]
