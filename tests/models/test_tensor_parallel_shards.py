"""Tensor parallel in one process: weight slicing, sharded forward, refusals, launcher helpers.

The forward tests run the ranks of a group as threads whose collectives meet at a barrier
(no torch.distributed), so they check the sharding math in seconds; tests/e2e/test_tensor_parallel.py
checks real processes over gloo.
"""
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from protocol.sampling import SamplingParams
from worker_svc import devices, runner as runner_module
from worker_svc.loader import load_model
from worker_svc.models.parallel_linear import ColumnParallelLinear, RowParallelLinear
from worker_svc.parallel import TensorParallel, default_group_id
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig
from tests.hf_model_folders import make_gemma2_folder, make_llama_folder, make_opt_folder
from tests.plan_player import PlanPlayer


@pytest.fixture(scope="module")
def gqa_folder(tmp_path_factory):
    """4 query heads over 2 KV heads, biases on every projection (o_proj's is added once)."""
    return make_llama_folder(str(tmp_path_factory.mktemp("tp") / "llama"),
                             num_key_value_heads=2, attention_bias=True, mlp_bias=True)


def _unsharded(models: list[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """The state of one unsharded model, rebuilt from the ranks' shards."""
    modules = [dict(m.named_modules()) for m in models]
    out = {}
    for name, param in models[0].named_parameters():
        module_name, _, param_name = name.rpartition(".")
        owner = modules[0][module_name]
        shards = [dict(m.named_parameters())[name] for m in models]
        if isinstance(owner, ColumnParallelLinear):
            sizes = owner.shard_sizes or (param.shape[0],)
            per_rank = [s.split(sizes) for s in shards]  # [rank][part]
            out[name] = torch.cat([torch.cat(parts) for parts in zip(*per_rank)])
        elif isinstance(owner, RowParallelLinear) and param_name == "weight":
            out[name] = torch.cat(shards, dim=1)
        else:
            assert all(torch.equal(s, param) for s in shards), f"{name} is not replicated"
            out[name] = param
    return out


@pytest.mark.parametrize("source", ["micro-llama", "tiny-opt", "gqa_folder"])
def test_two_ranks_hold_exactly_the_weights_of_one(source, request):
    model = request.getfixturevalue(source) if source == "gqa_folder" else source
    whole = dict(load_model(model, dtype="float32").model.named_parameters())
    ranks = [load_model(model, dtype="float32", tp=TensorParallel(2, r)).model for r in range(2)]
    rebuilt = _unsharded(ranks)
    assert rebuilt.keys() == whole.keys()
    for name, param in whole.items():
        assert torch.equal(rebuilt[name], param), name


def test_kv_heads_must_divide_and_state_models_refuse(gqa_folder):
    with pytest.raises(ValueError, match="num_key_value_heads"):
        load_model(gqa_folder, tp=TensorParallel(4, 0))  # 4 query heads split, 2 KV heads not
    with pytest.raises(ValueError, match="does not support tensor parallelism"):
        load_model("tiny-mamba", tp=TensorParallel(2, 0))
    with pytest.raises(ValueError, match="dist-init-address"):
        RunnerConfig(model="micro-llama", tensor_parallel_size=2, rank=1)


class _Exchange:
    """Collectives of ranks that are threads: each puts its value, all read every value."""

    def __init__(self, size: int):
        self.barrier = threading.Barrier(size, timeout=60)
        self.values = [None] * size

    def all_gather(self, rank: int, value):
        self.values[rank] = value
        self.barrier.wait()
        values = list(self.values)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return values


@dataclass(frozen=True)
class _ThreadTP(TensorParallel):
    exchange: _Exchange | None = None

    def all_reduce(self, x):
        parts = self.exchange.all_gather(self.rank, x.clone())
        return x.copy_(sum(parts[1:], parts[0]))  # same order on every rank

    def min_over_ranks(self, value, device):
        return min(self.exchange.all_gather(self.rank, value))

    def broadcast_tokens(self, tokens, num_tokens, device):
        return self.exchange.all_gather(self.rank, tokens)[0]


class _ThreadGroup:
    """Looks like one runner to PlanPlayer: every plan goes to every rank, rank 0 answers."""

    def __init__(self, ranks: list[ModelRunner]):
        self.ranks = ranks
        self.block_size, self.num_gpu_blocks = ranks[0].block_size, ranks[0].num_gpu_blocks
        self.num_cpu_blocks = ranks[0].num_cpu_blocks

    def execute(self, plan):
        results = [None] * len(self.ranks)

        def run(rank: int):
            results[rank] = self.ranks[rank].execute(plan)

        threads = [threading.Thread(target=run, args=(r,)) for r in range(len(self.ranks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r.sampled_token_ids == results[0].sampled_token_ids for r in results)
        return results[0]


def _config(model: str, size: int, rank: int) -> RunnerConfig:
    return RunnerConfig(model=model, dtype="float32", block_size=4, num_gpu_blocks=128,
                        tensor_parallel_size=size, rank=rank,
                        dist_init_address="thread://" if size > 1 else "")


def _generate(runner, prompts: dict) -> dict:
    player = PlanPlayer(runner, token_budget=16)  # long prompts are chunked
    for request_id, (prompt, params) in prompts.items():
        player.add(request_id, prompt, params)
    return player.run()


@pytest.mark.parametrize("make_folder", [None, make_opt_folder, make_gemma2_folder],
                         ids=["llama-gqa", "opt", "gemma2"])
def test_threaded_group_generates_what_one_worker_does(make_folder, gqa_folder, tmp_path,
                                                       monkeypatch):
    folder = gqa_folder if make_folder is None else make_folder(str(tmp_path / "m"))
    rng = np.random.default_rng(0)
    greedy = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)
    seeded = SamplingParams(temperature=1.0, seed=7, ignore_eos=True, max_tokens=6)
    prompts = {f"g{i}": (rng.integers(4, 1000, n).tolist(), greedy)
               for i, n in enumerate((1, 5, 23, 40))}
    prompts["s"] = ([9, 8, 7], seeded)
    one = ModelRunner(_config(folder, 1, 0))
    alone = _generate(one, prompts)
    exchange = _Exchange(2)
    monkeypatch.setattr(runner_module, "TensorParallel",
                        lambda size, rank: _ThreadTP(size, rank, exchange))
    monkeypatch.setattr(runner_module, "init_process_group", lambda *args: None)
    group = _ThreadGroup([ModelRunner(_config(folder, 2, r)) for r in range(2)])
    # kv: [2, blocks, block_size, Hkv, D]: a rank caches only its own KV heads
    assert group.ranks[1].caches.kv[0].shape[-2] * 2 == one.caches.kv[0].shape[-2]
    together = _generate(group, prompts)
    greedy_ids = [k for k in prompts if k != "s"]
    assert [together[k] for k in greedy_ids] == [alone[k] for k in greedy_ids]
    # Every rank appended rank 0's sampled tokens, random ones included.
    tables = [r.requests for r in group.ranks]
    assert np.array_equal(tables[0].token_ids, tables[1].token_ids)


def test_group_id_and_per_device_arguments():
    address = "tcp://127.0.0.1:29533"
    assert default_group_id(address) == default_group_id(address) != default_group_id("tcp://127.0.0.1:1")
    assert default_group_id("tcp://10.0.0.5:29533") == "tp:tcp://10.0.0.5:29533"
    argv = ["--model", "m", "--devices", "all", "--device", "cpu"]
    assert devices.child_argv(argv, 1, None) == ["--model", "m", "--device", "cpu", "--device", "cuda:1"]
    assert devices.child_argv(["--devices=all"], 0, "w")[-2:] == ["--worker-id", "w/cuda:0"]
