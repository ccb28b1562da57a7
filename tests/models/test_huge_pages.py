"""worker_svc/huge_pages.py: a model's weights moved into one mapping advised for transparent huge
pages keep their values, shapes, dtypes and sharing (a tied head is the embedding still), start at
a huge page, and the model computes what it computed before."""
import mmap

import pytest
import torch

from worker_svc import huge_pages
from worker_svc.presets import preset_config
from worker_svc.models import model_class
from worker_svc.loader import init_dummy_weights


def test_weights_move_with_their_values_and_the_model_computes_the_same():
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        pytest.skip("this platform's mmap has no MADV_HUGEPAGE: weights stay where they are")
    config = {**preset_config("tiny-qwen3"), "tie_word_embeddings": True}
    model = model_class(config)(config, torch.float32)
    init_dummy_weights(model, seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert model.lm_head_weight is model.embed_tokens.weight
    # The forward itself needs the runner's context (attention), so check a layer and the head:
    # the same kernel on the moved weights gives the same bits.
    layer, ids = model.layers[0].mlp, torch.tensor([5, 6, 7])
    x = torch.randn(3, config["hidden_size"])
    computed = layer.gate_up_proj(x)
    moved = huge_pages.move_weights(model)
    if moved == 0:
        pytest.skip("this kernel refuses MADV_HUGEPAGE: weights stay where they are")
    assert moved >= sum(p.numel() * p.element_size() for p in before.values())
    params = dict(model.named_parameters())
    assert params.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(params[name], value) and params[name].dtype == value.dtype, name
        assert params[name].data_ptr() % huge_pages.ALIGN == 0, name
    first = min(p.data_ptr() for p in params.values())
    assert first % huge_pages.HUGE_PAGE == 0
    assert model.lm_head_weight is model.embed_tokens.weight  # shared parameters move once, together
    assert torch.equal(layer.gate_up_proj(x), computed)
    assert torch.equal(model.embed_tokens(ids), before["embed_tokens.weight"][ids])
