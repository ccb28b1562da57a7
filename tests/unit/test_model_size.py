"""The one measure of a small model (worker_svc/model_size.py) and the two thresholds that take it."""
from stepserve.default_replicas import SMALL_MODEL_BYTES
from worker_svc.cpu_threads import ONE_THREAD_BELOW_BYTES
from worker_svc.model_size import weight_bytes


def test_each_threshold_falls_between_the_models_it_was_measured_on():
    micro_llama, tiny_llama, opt_125m = (weight_bytes(name) for name in ("micro-llama", "tiny-llama", "opt-125m"))
    assert micro_llama < ONE_THREAD_BELOW_BYTES < tiny_llama  # one thread won, then several
    assert tiny_llama <= SMALL_MODEL_BYTES < opt_125m  # one-thread replicas won, then one replica


def test_the_small_presets_run_on_one_thread_and_the_others_on_every_core():
    small = {"micro-llama", "tiny-opt", "tiny-mamba", "tiny-jamba"}
    large = {"tiny-llama", "tiny-qwen3", "tiny-mixtral", "opt-125m", "qwen3-0.6b", "llama-3.2-1b"}
    assert all(weight_bytes(name) < ONE_THREAD_BELOW_BYTES for name in small)
    assert all(weight_bytes(name) >= ONE_THREAD_BELOW_BYTES for name in large)


def test_a_folder_weighs_its_weight_files_and_an_unknown_name_nothing(tmp_path):
    assert weight_bytes("no-such-model") == 0
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "README.md").write_text("not weights")
    assert weight_bytes(str(tmp_path)) == 10
