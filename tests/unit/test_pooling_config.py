"""worker_svc/pooling_config.py: the task a folder serves and its pooling, read from
config.json and sentence-transformers' files (both spellings of the Pooling config)."""
import json
import os

import pytest

from worker_svc.pooling_config import pooling_info, resolve_task, sentence_transformers_pooling

BERT = {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 384}
CLASSIFIER = {"architectures": ["XLMRobertaForSequenceClassification"], "model_type": "xlm-roberta",
              "hidden_size": 64, "id2label": {"1": "yes", "0": "no"}}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64}


def folder(tmp_path, config: dict, modules: list[str] | None = None, pooling: dict | None = None) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    if modules is not None:
        paths = {"Pooling": "1_Pooling", "Normalize": "2_Normalize"}
        (tmp_path / "modules.json").write_text(json.dumps(
            [{"idx": i, "name": str(i), "path": paths.get(kind, ""), "type": f"sentence_transformers.models.{kind}"}
             for i, kind in enumerate(modules)]))
        os.makedirs(tmp_path / "1_Pooling")
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling or {}))
    return str(tmp_path)


def info(path: str, config: dict, task: str = "auto", **overrides):
    return pooling_info(resolve_task(task, path, config), path, config, **overrides)


def test_tasks_from_the_folder(tmp_path):
    assert resolve_task("auto", folder(tmp_path, BERT), BERT) == "embed"
    assert resolve_task("auto", str(tmp_path), CLASSIFIER) == "classify"
    assert resolve_task("auto", str(tmp_path), QWEN3) == "generate"
    assert resolve_task("auto", "all-minilm-l6-v2", {"architectures": ["BertModel"]}) == "embed"
    assert resolve_task("embed", str(tmp_path), QWEN3) == "embed"
    with pytest.raises(ValueError, match="no LM head"):
        resolve_task("generate", str(tmp_path), BERT)
    with pytest.raises(ValueError, match="no classifier head"):
        resolve_task("classify", str(tmp_path), QWEN3)


def test_sentence_transformers_files(tmp_path):
    old_style = {"word_embedding_dimension": 384, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}
    path = folder(tmp_path, QWEN3, ["Transformer", "Pooling", "Normalize"], old_style)
    assert resolve_task("auto", path, QWEN3) == "embed"  # a causal model with modules.json: Qwen3-Embedding
    assert sentence_transformers_pooling(path) == ("MEAN", True)
    pooling = info(path, QWEN3)
    assert (pooling.task, pooling.pooling_type, pooling.normalize, pooling.size, pooling.bidirectional) == (
        "embed", "MEAN", True, 64, False)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "lasttoken"}))  # release 6
    assert sentence_transformers_pooling(path) == ("LAST", True)


def test_without_sentence_transformers_files_vllms_defaults(tmp_path):
    encoder = info(folder(tmp_path, BERT), BERT)
    assert (encoder.pooling_type, encoder.normalize, encoder.size, encoder.bidirectional) == ("CLS", True, 384, True)
    causal = info(str(tmp_path), QWEN3, task="embed")
    assert (causal.pooling_type, causal.normalize) == ("LAST", True)
    overridden = info(str(tmp_path), BERT, pooling_type="MEAN", normalize=False)
    assert (overridden.pooling_type, overridden.normalize) == ("MEAN", False)
    assert info(str(tmp_path), QWEN3) is None  # a generative model


def test_classifier_labels_in_id_order(tmp_path):
    classifier = info(folder(tmp_path, CLASSIFIER), CLASSIFIER)
    assert (classifier.task, classifier.size, classifier.labels, classifier.pooling_type) == (
        "classify", 2, ["no", "yes"], "CLS")


@pytest.mark.parametrize("modules, pooling, reason", [
    (["Transformer", "Pooling", "Dense"], {"pooling_mode_mean_tokens": True}, "Dense"),
    (["Transformer", "Pooling"], {"pooling_mode_max_tokens": True}, "max_tokens"),
    (["Transformer", "Pooling"], {"pooling_mode": "weightedmean"}, "weightedmean"),
])
def test_what_would_change_the_embeddings_is_refused(tmp_path, modules, pooling, reason):
    with pytest.raises(ValueError, match=reason):
        sentence_transformers_pooling(folder(tmp_path, BERT, modules, pooling))
