"""The replicas a local cluster starts when the caller leaves data_parallel_size unset."""
from stepserve import default_replicas
from stepserve.default_replicas import default_data_parallel_size, flag_value, runs_on_cpu
from stepserve.launcher import LocalCluster
from worker_svc.model_size import weight_bytes


def test_flag_value_takes_both_spellings_and_the_last_one():
    assert flag_value(["--device", "cuda:0", "--dtype", "bf16"], "--device") == "cuda:0"
    assert flag_value(["--device=cpu", "--device", "cuda:1"], "--device") == "cuda:1"
    assert flag_value(["--devices", "all"], "--device") is None
    assert flag_value(["--threads"], "--threads") is None  # no value: argparse would refuse it


def test_cpu_is_the_workers_default_device():
    assert runs_on_cpu([]) and runs_on_cpu(["--device", "cpu"])
    assert not runs_on_cpu(["--device", "cuda:0"]) and not runs_on_cpu(["--devices", "all"])


def test_a_small_cpu_model_gets_one_replica_per_core(monkeypatch):
    monkeypatch.setattr(default_replicas, "usable_cpus", lambda: 4)
    assert default_data_parallel_size("micro-llama", [], 1) == 4
    assert default_data_parallel_size("micro-llama", ["--device", "cpu", "--dtype", "bfloat16"], 1) == 4
    monkeypatch.setattr(default_replicas, "usable_cpus", lambda: 64)
    assert default_data_parallel_size("micro-llama", ["--kv-cache-gb", "0.01"], 1) == default_replicas.MAX_REPLICAS


def test_one_replica_on_cuda_with_threads_or_tensor_parallel_or_a_large_model(monkeypatch, tmp_path):
    monkeypatch.setattr(default_replicas, "usable_cpus", lambda: 4)
    assert default_data_parallel_size("micro-llama", ["--device", "cuda:0"], 1) == 1
    assert default_data_parallel_size("micro-llama", ["--threads", "2"], 1) == 1
    assert default_data_parallel_size("micro-llama", [], 2) == 1
    assert default_data_parallel_size("opt-125m", [], 1) == 1  # a preset of 125M weights
    with open(tmp_path / "model.safetensors", "wb") as f:  # sparse: sized, not written
        f.truncate(default_replicas.SMALL_MODEL_BYTES + 1)
    (tmp_path / "config.json").write_text("{}")
    assert weight_bytes(str(tmp_path)) == default_replicas.SMALL_MODEL_BYTES + 1
    assert default_data_parallel_size(str(tmp_path), [], 1) == 1


def test_replicas_are_bounded_by_memory(monkeypatch):
    monkeypatch.setattr(default_replicas, "usable_cpus", lambda: 8)
    monkeypatch.setattr(default_replicas, "_available_memory_bytes", lambda: 5 << 30)
    assert default_data_parallel_size("micro-llama", [], 1) == 2  # 1 GiB of KV cache each, half of 5 GiB
    monkeypatch.setattr(default_replicas, "_available_memory_bytes", lambda: 1 << 30)
    assert default_data_parallel_size("micro-llama", [], 1) == 1


def test_the_local_cluster_resolves_an_unset_size_and_keeps_a_given_one(monkeypatch):
    monkeypatch.setattr(default_replicas, "usable_cpus", lambda: 3)
    monkeypatch.setattr(default_replicas, "_available_memory_bytes", lambda: 64 << 30)
    assert LocalCluster("micro-llama").data_parallel_size == 3
    assert LocalCluster("micro-llama", 3).data_parallel_size == 3
    assert LocalCluster("micro-llama", worker_args=["--device", "cuda:0"]).data_parallel_size == 1
