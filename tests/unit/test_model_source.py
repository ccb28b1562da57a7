"""What `--model` names (worker_svc/model_source.py): a preset or an existing folder is itself, an
ORG/NAME otherwise a Hugging Face hub id found in the hub's cache at its revision; and which
weight files a checkpoint loads. A cache made on disk; huggingface_hub offline, or its hub out of reach."""
import json
import socket

import pytest
from huggingface_hub import constants

from tests.hf_hub_cache import add_to_hub_cache
from worker_svc.model_source import ModelUnavailable, is_hub_id, resolve_model, weight_files


@pytest.fixture
def offline(monkeypatch):
    """As HF_HUB_OFFLINE=1 in the environment: huggingface_hub read it when first imported."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def _model_files(folder, **config) -> str:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"weights")
    return str(folder)


def test_the_form_of_a_hub_id():
    for name in ("Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B", "test-org/tiny_model.v2", "a/b"):
        assert is_hub_id(name), name
    for name in ("tiny-llama", "/models/llama", "./org/name", "../name", "org/name/sub", "org//name",
                 "-org/name", "org/name.", "org--x/name", "org/na..me", "org/", "/name"):
        assert not is_hub_id(name), name


def test_a_preset_and_an_existing_folder_are_themselves_and_any_other_name_is_left_for_the_loader(
        tmp_path, monkeypatch, offline):
    assert resolve_model("tiny-llama") == "tiny-llama"
    folder = _model_files(tmp_path / "anywhere")
    assert resolve_model(folder, revision="v2") == folder  # a revision is a hub id's alone
    monkeypatch.chdir(tmp_path)
    _model_files(tmp_path / "test-org" / "tiny-model")
    assert resolve_model("test-org/tiny-model") == "test-org/tiny-model"  # the folder wins over the id
    assert resolve_model("no-such-model") == "no-such-model"  # read_config says what it is not


def test_a_hub_id_is_its_snapshot_in_the_cache_at_its_revision(tmp_path, offline):
    cache = str(tmp_path / "hub")
    main = add_to_hub_cache(cache, "test-org/tiny-model", _model_files(tmp_path / "main", name="main"))
    tagged = add_to_hub_cache(cache, "test-org/tiny-model", _model_files(tmp_path / "v1", name="v1"), ref="v1")
    snapshots = tmp_path / "hub" / "models--test-org--tiny-model" / "snapshots"
    assert resolve_model("test-org/tiny-model", download_dir=cache) == str(snapshots / main)
    assert resolve_model("test-org/tiny-model", "v1", cache) == str(snapshots / tagged)
    assert resolve_model("test-org/tiny-model", tagged, cache) == str(snapshots / tagged)  # a commit hash
    with open(snapshots / tagged / "config.json") as f:
        assert json.load(f) == {"name": "v1"}


def test_a_hub_id_or_revision_not_in_the_cache_is_one_line_naming_it(tmp_path, offline):
    cache = str(tmp_path / "hub")
    add_to_hub_cache(cache, "test-org/tiny-model", _model_files(tmp_path / "main"))
    with pytest.raises(ModelUnavailable) as missing:
        resolve_model("no-org/no-model", download_dir=cache)
    assert str(missing.value) == (f"cannot load model 'no-org/no-model': no such folder, and not in the Hugging Face "
                                  f"cache ({cache}); HF_HUB_OFFLINE=1 forbids downloading it: run once with network "
                                  "access, or unset HF_HUB_OFFLINE")
    with pytest.raises(ModelUnavailable, match=r"^cannot load model 'test-org/tiny-model': .* at revision 'v9'; ") as e:
        resolve_model("test-org/tiny-model", "v9", cache)
    assert "\n" not in str(e.value)


def test_a_hub_out_of_reach_leaves_the_cached_copy_or_one_line(tmp_path, monkeypatch, caplog):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
    cache = str(tmp_path / "hub")
    commit = add_to_hub_cache(cache, "test-org/tiny-model", _model_files(tmp_path / "main"))
    folder = resolve_model("test-org/tiny-model", download_dir=cache)
    assert folder.endswith(f"snapshots/{commit}") and "could not be reached" in caplog.text
    with pytest.raises(ModelUnavailable, match=r"^cannot load model 'no-org/no-model': no such folder, and not in "
                                               r"the Hugging Face cache .*; the Hugging Face Hub could not be reached "
                                               r"\(.+\): check the network"):
        resolve_model("no-org/no-model", download_dir=cache)


def test_a_snapshot_without_a_config_is_not_a_model(tmp_path, offline):
    cache = str(tmp_path / "hub")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "README.md").write_text("a dataset, say")
    add_to_hub_cache(cache, "test-org/readme-only", str(tmp_path / "files"))
    with pytest.raises(ModelUnavailable, match=r"'test-org/readme-only': its files \(.*\) have no config.json"):
        resolve_model("test-org/readme-only", download_dir=cache)


def test_weight_files_take_safetensors_first_and_only_what_an_index_names():
    shards = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                             "c": "model-00001-of-00002.safetensors"}}
    sharded = ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors", "consolidated.safetensors", "pytorch_model.bin"]
    read_index = {"model.safetensors.index.json": shards}.__getitem__
    assert weight_files(sharded, "auto", read_index) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors"]
    assert weight_files(sharded, "pt", read_index) == ["pytorch_model.bin"]
    assert weight_files(["config.json", "model.safetensors"], "auto", read_index) == ["model.safetensors"]
    assert weight_files(["config.json", "pytorch_model.bin"], "auto", read_index) == ["pytorch_model.bin"]
    assert weight_files(["config.json", "pytorch_model.bin"], "safetensors", read_index) == []
    assert weight_files(sharded, "dummy", read_index) == []
