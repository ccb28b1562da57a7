"""Batch inference on Ray Data, in the shape of Ray's own LLM processors (`ray.data.llm`):

    from stepserve.ray_data import ProcessorConfig, build_processor
    processor = build_processor(ProcessorConfig(model="tiny-llama", concurrency=2,
                                                sampling_params={"max_tokens": 16}),
                                preprocess=lambda row: {"prompt": row["text"]},
                                postprocess=lambda row: {"answer": row["generated_text"]})
    out = processor(ray.data.read_parquet(...))      # a Dataset -> Dataset callable

Each of `concurrency` actors runs a stepserve replica on its node (a scheduler and its
workers, as `LLM` does) or, with `address=`, connects to a running service. A row carries
`prompt` (text), `prompt_token_ids` or chat `messages`, and optionally `sampling_params` (a
dict over the config's); it gains `generated_text`, `generated_token_ids`, `num_input_tokens`,
`num_generated_tokens`, `finish_reason` and `error` (None, or "code: message" for a row that
failed alone: the job goes on). With an embedding model (engine_kwargs={"task": "embed"}, or a
BERT folder) a row's `prompt` or `prompt_token_ids` gains `embedding` (a list of floats),
`num_input_tokens` and `error` instead.

Ray is imported only here, and only when this module is: `import client_sdk` never pulls it in.
"""
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec
import numpy as np
import ray.data

from client_sdk.client import AsyncClient
from client_sdk.errors import ChatTemplateError
from protocol.sampling import SamplingParams
from stepserve.cluster_args import child_args
from stepserve.launcher import LocalCluster

OUTPUT_COLUMNS = ("generated_text", "generated_token_ids", "num_input_tokens", "num_generated_tokens",
                  "finish_reason", "error")
EMBEDDING_COLUMNS = ("embedding", "num_input_tokens", "error")


@dataclass
class ProcessorConfig:
    """model: a preset name, a model folder present on every node, or a Hugging Face hub id that
    each actor fetches on its node (engine_kwargs' revision and download_dir, as LLM's); ignored
    with address.
    address: a running service's frontend; the actors then start nothing of their own.
    concurrency: actors (replicas, without address). num_cpus / num_gpus: each actor's Ray
    resources; a CPU worker takes num_cpus threads. batch_size: rows per call of an actor; each
    actor has up to max_concurrent_batches calls open, all their rows in flight on its replica
    (Ray Data runs up to 4 batches of one task at once: the window is at most
    4 * max_concurrent_batches * batch_size rows). engine_kwargs: LLM's options (dtype,
    enforce_eager, kv_cache_gb, max_num_seqs, ...). client_kwargs: AsyncClient's (CurveZMQ keys
    for a service at address)."""

    model: str = "tiny-llama"
    address: str | None = None
    concurrency: int = 1
    sampling_params: dict[str, Any] = field(default_factory=dict)
    batch_size: int = 64
    max_concurrent_batches: int = 2
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    client_kwargs: dict[str, Any] = field(default_factory=dict)
    startup_timeout_s: float = 600.0


def build_processor(config: ProcessorConfig, preprocess: Callable[[dict], dict] | None = None,
                    postprocess: Callable[[dict], dict] | None = None) -> Callable[[ray.data.Dataset], ray.data.Dataset]:
    """A Dataset -> Dataset callable: preprocess each row, generate, postprocess each row."""
    def process(dataset: ray.data.Dataset) -> ray.data.Dataset:
        if preprocess is not None:
            dataset = dataset.map(preprocess)
        dataset = dataset.map_batches(
            StepserveBatchUDF, fn_constructor_kwargs={"config": config}, batch_size=config.batch_size,
            batch_format="numpy", num_cpus=config.num_cpus, num_gpus=config.num_gpus or None,
            compute=ray.data.ActorPoolStrategy(size=config.concurrency,
                                               max_concurrent_calls_per_actor=config.max_concurrent_batches))
        if postprocess is not None:
            dataset = dataset.map(postprocess)
        return dataset
    return process


class StepserveBatchUDF:
    """The stateful class Ray Data runs in each actor: a replica (or a connection), and an
    async __call__ per batch. Ray Data retries a dead actor's task from its start on a new
    actor and needs the same output order each time, so a batch's rows come back in input
    order once all have finished (generate_iter bounds and streams them meanwhile)."""

    def __init__(self, config: ProcessorConfig):
        self.config = config
        self.cluster = None
        if config.address is None:
            options = dict(config.engine_kwargs)
            curve_keys = options.pop("curve_keys", None)  # a keys folder present on every node
            scheduler_args, worker_args = child_args(**options)
            device = options.get("device")
            if (device is None or device == "cpu") and config.num_cpus >= 1:
                worker_args += ["--threads", str(int(config.num_cpus))]
            # Started here, on the actor's main thread: its processes die with the actor's
            # (child_processes.py binds them to the thread that spawned them).
            self.cluster = LocalCluster(config.model, config.data_parallel_size, scheduler_args=scheduler_args,
                                        worker_args=worker_args, tensor_parallel_size=config.tensor_parallel_size,
                                        curve_keys=curve_keys).start(config.startup_timeout_s)
        self.defaults = dict(config.sampling_params)
        self._client: AsyncClient | None = None  # made on Ray Data's event loop, at the first batch

    def _address(self) -> tuple[str, dict]:
        if self.cluster is not None:
            return self.cluster.address, self.cluster.client_keys
        return self.config.address, self.config.client_kwargs

    async def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._client is None:
            address, keys = self._address()
            self._client = AsyncClient(address, **keys)
            await self._client.wait_for_workers(1, timeout_s=self.config.startup_timeout_s)
        num_rows = len(next(iter(batch.values()))) if batch else 0
        rows = [{name: column[i] for name, column in batch.items()} for i in range(num_rows)]
        info = await self._client.served_model()
        embeds = info.pooling is not None and info.pooling.task == "embed"
        results: list[dict] = [{}] * num_rows
        to_send, sent_index = [], []
        for i, row in enumerate(rows):
            try:
                if embeds and not _given(row.get("prompt_token_ids")) and not _given(row.get("prompt")):
                    raise ValueError("an embedding row needs 'prompt' or 'prompt_token_ids'")
                to_send.append((await self._prompt_of(row), None if embeds else self._params_of(row)))
                sent_index.append(i)
            except (ValueError, TypeError, ChatTemplateError) as e:  # this row alone fails
                results[i] = _failed("invalid_row", str(e), embeds)
        if to_send:
            prompts, params = zip(*to_send)
            outputs = (self._client.embed_iter(list(prompts), window=len(prompts)) if embeds
                       else self._client.generate_iter(list(prompts), list(params), window=len(prompts)))
            async for j, output in outputs:
                results[sent_index[j]] = _embedding_columns_of(output) if embeds else _columns_of(output)
        return _with_columns(batch, EMBEDDING_COLUMNS if embeds else OUTPUT_COLUMNS, results)

    async def _prompt_of(self, row: dict):
        if _given(row.get("prompt_token_ids")):
            return [int(t) for t in row["prompt_token_ids"]]
        if _given(row.get("prompt")):
            return str(row["prompt"])
        if _given(row.get("messages")):
            messages = [{str(k): v for k, v in m.items()} for m in row["messages"]]
            return await self._client.apply_chat_template(messages)
        raise ValueError("a row needs 'prompt', 'prompt_token_ids' or 'messages'")

    def _params_of(self, row: dict) -> SamplingParams:
        own = row.get("sampling_params")
        merged = {**self.defaults, **({k: v for k, v in own.items() if v is not None} if _given(own) else {})}
        try:
            return msgspec.convert(_plain(merged), SamplingParams, strict=False)  # Arrow makes 5 a 5.0
        except msgspec.ValidationError as e:
            raise ValueError(f"invalid sampling params: {e}") from None


def _given(value) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value))


def _plain(value):
    """numpy scalars and arrays (how Ray Data hands nested columns over) as Python values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (np.ndarray, list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _columns_of(output) -> dict:
    choice = output.outputs[0]
    error = f"{choice.error_code}: {choice.error_message}" if choice.finish_reason == "error" else None
    return {"generated_text": choice.text, "generated_token_ids": list(choice.token_ids),
            "num_input_tokens": output.num_prompt_tokens, "num_generated_tokens": len(choice.token_ids),
            "finish_reason": choice.finish_reason, "error": error}


def _embedding_columns_of(output) -> dict:
    if output.error_code is not None:
        return _failed(output.error_code, output.error_message or "", embeds=True)
    return {"embedding": output.outputs.embedding, "num_input_tokens": len(output.prompt_token_ids), "error": None}


def _failed(code: str, message: str, embeds: bool = False) -> dict:
    if embeds:
        return {"embedding": None, "num_input_tokens": 0, "error": f"{code}: {message}"}
    return {"generated_text": None, "generated_token_ids": [], "num_input_tokens": 0, "num_generated_tokens": 0,
            "finish_reason": "error", "error": f"{code}: {message}"}


def _with_columns(batch: dict[str, np.ndarray], names: tuple[str, ...], results: list[dict]) -> dict[str, np.ndarray]:
    """The batch's own columns and the results' (in the rows' order)."""
    out = {name: column for name, column in batch.items() if name not in names}
    for name in names:
        values = [r[name] for r in results]
        out[name] = np.array(values, dtype=np.int64) if name.startswith("num_") else _column(values)
    return out


def _column(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column

