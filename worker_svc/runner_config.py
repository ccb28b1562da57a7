"""RunnerConfig: how a worker loads its model and sizes its memory; validated where built."""
import argparse
import os
import typing
from dataclasses import dataclass, fields

from protocol.pooling import POOLING_TYPES, TASKS


@dataclass(frozen=True)
class RunnerConfig:
    model: str = "tiny-llama"  # a preset name (worker_svc.presets), a Hugging Face folder or hub id
    # Of a hub id (model_source.py): the branch, tag or commit (None: main), and the hub cache
    # it is downloaded into (None: huggingface_hub's, HF_HUB_CACHE / HF_HOME).
    revision: str | None = None
    download_dir: str | None = None
    dtype: str = "auto"  # float32 / bfloat16 / float16 / auto (folder: config; preset: bf16)
    device: str = "cpu"  # cpu or cuda:N
    load_format: str = "auto"  # auto / safetensors / pt / dummy (seeded random weights)
    seed: int = 0  # of dummy weights
    block_size: int = 16
    max_model_len: int | None = None  # None: the config's max_position_embeddings
    kv_cache_gb: float = 1.0  # CPU: KV cache size
    gpu_memory_utilization: float = 0.9  # CUDA: fraction of the device's memory we may fill
    swap_space_gb: float = 0.0  # host memory for swapped-out blocks; 0 disables swap
    num_state_slots: int = 256  # Mamba state slots, for models with state layers
    num_gpu_blocks: int | None = None  # override the computed number of device KV blocks
    # Tensor parallel: this process is rank `rank` of a group of tensor_parallel_size processes
    # that meet at dist_init_address (tcp://host:port, required when the size is > 1).
    tensor_parallel_size: int = 1
    rank: int = 0
    dist_init_address: str = ""
    # Run the model eagerly, op by op, instead of the compiled graph (model_executor.py).
    enforce_eager: bool = False
    # CUDA: graphs of the compiled step for decode batches up to this size (cuda_graphs.py;
    # vLLM's max_cudagraph_capture_size); 0: none. --enforce-eager turns them off too.
    max_cudagraph_capture_size: int = 512
    compile_cache_dir: str | None = None  # None: ~/.cache/stepserve (compile_cache.py)
    # Sampling defaults for requests that leave a field unset: "auto", the model folder's
    # generation_config.json; "vllm", none (SamplingParams' own); or a folder holding one.
    generation_config: str = "auto"
    # torch's CPU threads in this process; None: one for a model with few weights, else torch's
    # default (cpu_threads.py)
    threads: int | None = None
    # What the worker serves (pooling_config.py): auto (from the folder), generate, embed or
    # classify; and a pooling model's overrides of the folder's pooling type (CLS, MEAN, LAST)
    # and normalisation (None: the folder's, else vLLM's defaults).
    task: str = "auto"
    pooling_type: str | None = None
    normalize: bool | None = None

    def __post_init__(self):
        if self.block_size <= 0 or self.num_state_slots < 0 or self.max_cudagraph_capture_size < 0:
            raise ValueError("block_size must be > 0, num_state_slots and max_cudagraph_capture_size >= 0")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.kv_cache_gb < 0 or self.swap_space_gb < 0:
            raise ValueError("kv_cache_gb and swap_space_gb must be >= 0")
        if not 0 <= self.rank < self.tensor_parallel_size:
            raise ValueError(f"rank {self.rank} not in [0, tensor_parallel_size "
                             f"{self.tensor_parallel_size})")
        if self.generation_config not in ("auto", "vllm") and not os.path.isdir(self.generation_config):
            raise ValueError(f"generation_config {self.generation_config!r}: 'auto', 'vllm' or a folder")
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r} not in {TASKS}")
        if self.pooling_type not in (None, *POOLING_TYPES):
            raise ValueError(f"pooling_type {self.pooling_type!r} not in {POOLING_TYPES}")
        if self.tensor_parallel_size > 1 and not self.dist_init_address:
            raise ValueError("--dist-init-address is required when --tensor-parallel-size > 1")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """--model, --dtype, ... one flag per RunnerConfig field, with its default; a bool field
    is a switch (--enforce-eager / --no-enforce-eager; a bool | None field left unset is None)."""
    for f in fields(RunnerConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in (bool, bool | None):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
            continue
        kind = next(t for t in typing.get_args(f.type) or (f.type,) if t is not type(None))
        parser.add_argument(flag, type=kind, default=f.default)


def from_args(args: argparse.Namespace) -> RunnerConfig:
    return RunnerConfig(**{f.name: getattr(args, f.name) for f in fields(RunnerConfig)})
