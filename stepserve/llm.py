"""LLM: offline batch inference the way vLLM's `LLM` offers it, on a local cluster.

Code written for vLLM's LLM runs unchanged: `LLM(model, tensor_parallel_size=...,
data_parallel_size=..., dtype=..., max_model_len=..., gpu_memory_utilization=..., seed=...)`,
`generate(prompts, sampling_params)` with one SamplingParams or one per prompt, returning
RequestOutput objects (`outputs[0].outputs[0].text`), and `chat(messages, sampling_params)`.
A pooling model (`LLM(model, task="embed")`, or a folder whose kind says so) answers `embed`,
`classify` and `score` as vLLM's does.
"""
import itertools
import os
import random

import msgspec

from client_sdk.outputs import RequestOutput
from client_sdk.pooling_outputs import ClassificationRequestOutput, EmbeddingRequestOutput, ScoringRequestOutput
from client_sdk.sync_client import Client
from protocol.curve import KEYS_DIR_ENV, SERVER_KEY_ENV
from protocol.pooling import PoolingParams
from protocol.sampling import SamplingParams
from stepserve.cluster_args import child_args
from stepserve.launcher import LocalCluster


class LLM:
    """Starts a scheduler and data_parallel_size replicas of tensor_parallel_size worker
    processes each for `model` (a preset name, a Hugging Face model folder, or a hub id ORG/NAME
    fetched into the hub's cache, in `download_dir` if given, at `revision`: docs/models.md; a
    RuntimeError of one line if it cannot be had), and serves `generate` and `chat` from them
    until `close()` (or the end of a `with`). Unlike vLLM's,
    data_parallel_size defaults to one replica per core for a small model on a CPU
    (default_replicas.py says why), else 1.

    seed: like vLLM's, makes sampling reproducible run to run: each request without a seed
    of its own gets one drawn from it.

    task: "auto" (from the folder: a BERT / XLM-RoBERTa / sentence-transformers folder embeds, a
    ...ForSequenceClassification classifies, anything else generates), "generate", "embed" (a
    causal model too: last-token pooling, as Qwen3-Embedding) or "classify": the workers' --task.

    curve_server_key / curve_secret_key (or their environment variables, or $STEPSERVE_CURVE_KEYS):
    CurveZMQ on every link of the local cluster, with the keys of `stepserve keys generate DIR`
    (the server key DIR/scheduler.key: the scheduler, the workers and the authorized keys are
    taken from the same DIR). Its processes die with this one, however it ends.
    """

    def __init__(self, model: str = "tiny-llama", *, task: str = "auto", revision: str | None = None,
                 download_dir: str | None = None,
                 tensor_parallel_size: int = 1, data_parallel_size: int | None = None, dtype: str | None = None,
                 max_model_len: int | None = None, gpu_memory_utilization: float | None = None,
                 seed: int | None = None, swap_space: float | None = None, device: str | None = None,
                 load_format: str | None = None, kv_cache_gb: float | None = None, block_size: int | None = None,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 enable_prefix_caching: bool | None = None, async_scheduling: bool | None = None,
                 scheduling_policy: str | None = None, routing: str | None = None,
                 enforce_eager: bool | None = None,
                 generation_config: str | None = None,
                 compile_cache_dir: str | None = None, scheduler_args: list[str] = (),
                 worker_args: list[str] = (), startup_timeout_s: float = 300.0, quiet: bool = True,
                 curve_server_key: str | None = None, curve_secret_key: str | None = None):
        own_scheduler_args, own_worker_args = child_args(
            task=task if task != "auto" else None, revision=revision, download_dir=download_dir, dtype=dtype,
            load_format=load_format,
            kv_cache_gb=kv_cache_gb, max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization, swap_space_gb=swap_space, device=device,
            block_size=block_size, enforce_eager=enforce_eager, compile_cache_dir=compile_cache_dir,
            generation_config=generation_config,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            preemption="swap" if swap_space else None, enable_prefix_caching=enable_prefix_caching,
            async_scheduling=async_scheduling, scheduling_policy=scheduling_policy, routing=routing)
        scheduler_args = own_scheduler_args + list(scheduler_args)
        worker_args = own_worker_args + list(worker_args)
        self._seeds = random.Random(seed) if seed is not None else None
        server_key = curve_server_key or os.environ.get(SERVER_KEY_ENV)
        keys_dir = os.path.dirname(os.path.abspath(server_key)) if server_key else os.environ.get(KEYS_DIR_ENV)
        self.cluster = LocalCluster(model, data_parallel_size, scheduler_args=scheduler_args, worker_args=worker_args,
                                    quiet=quiet, tensor_parallel_size=tensor_parallel_size,
                                    curve_keys=keys_dir, announce=True).start(startup_timeout_s)
        try:
            keys = self.cluster.client_keys
            if keys:
                keys = {"curve_server_key": server_key or keys["curve_server_key"],
                        "curve_secret_key": curve_secret_key or keys["curve_secret_key"]}
            self.client = Client(self.cluster.address, **keys)
        except BaseException:
            self.cluster.stop()
            raise

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
                 use_tqdm: bool = True, window: int | None = None, priority: int | list[int] = 0
                 ) -> list[RequestOutput]:
        """prompts: a string, token ids, {"prompt": ...} / {"prompt_token_ids": ...}, or any
        iterable of those (read lazily); one RequestOutput per prompt, in order. priority: one
        for all or one per prompt (vLLM's convention: lower is served first, under the
        scheduler's priority policy)."""
        if _is_one_prompt(prompts):
            prompts = [prompts]
        if isinstance(prompts, (list, tuple)):
            return self.client.generate_batch([_prompt_of(p) for p in prompts],
                                              self._seeded(sampling_params, len(prompts)), progress=use_tqdm,
                                              window=window, priority=priority)
        outputs: list[RequestOutput] = []
        for index, output in self.generate_iter(prompts, sampling_params, use_tqdm=use_tqdm, window=window,
                                                priority=priority):
            outputs += [None] * (index + 1 - len(outputs))
            outputs[index] = output
        return outputs

    def generate_iter(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
                      use_tqdm: bool = False, window: int | None = None, priority: int | list[int] = 0):
        """(index, RequestOutput) for each prompt as it finishes; prompts: any iterable, read
        lazily, with at most `window` requests in flight (see AsyncClient.generate_iter)."""
        if _is_one_prompt(prompts):
            prompts = [prompts]
        return self.client.generate_iter(map(_prompt_of, prompts), self._seeded_iter(sampling_params),
                                         progress=use_tqdm, window=window, priority=priority)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None, *, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None, tools: list[dict] | None = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"} messages, tool calls and `tool`
        messages included) or a list of them, rendered with the model's chat template (or
        `chat_template`) and completed. tools: OpenAI's function tools, for the template (as
        vLLM's LLM.chat: the output is the model's text; to force a call, give a SamplingParams
        whose structured_outputs is the function's parameters schema)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.client.apply_chat_template(c, chat_template=chat_template,
                                                   add_generation_prompt=add_generation_prompt, tools=tools,
                                                   **(chat_template_kwargs or {})) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def embed(self, prompts, pooling_params: PoolingParams | list[PoolingParams] | None = None, *,
              use_tqdm: bool = True, window: int | None = None, priority: int = 0) -> list[EmbeddingRequestOutput]:
        """One EmbeddingRequestOutput per prompt (prompts as generate's), in order
        (`outputs[0].outputs.embedding`); RequestError for the first that failed."""
        return self.client.embed(_prompt_list(prompts), pooling_params=pooling_params, progress=use_tqdm,
                                 window=window, priority=priority)

    def classify(self, prompts, pooling_params: PoolingParams | list[PoolingParams] | None = None, *,
                 use_tqdm: bool = True, window: int | None = None, priority: int = 0
                 ) -> list[ClassificationRequestOutput]:
        """One ClassificationRequestOutput per prompt, in order (`outputs[0].outputs.probs`)."""
        return self.client.classify(_prompt_list(prompts), pooling_params=pooling_params, progress=use_tqdm,
                                    window=window, priority=priority)

    def score(self, text_1: str | list[str], text_2: str | list[str], *, use_tqdm: bool = True,
              window: int | None = None, priority: int = 0) -> list[ScoringRequestOutput]:
        """vLLM's: one text_1 against each text_2, or pairwise for lists of equal length
        (`outputs[0].outputs.score`); a cross-encoder's probability, or an embedder's cosine."""
        return self.client.score(text_1, text_2, progress=use_tqdm, window=window, priority=priority)

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate uses when given no sampling_params: the model folder's
        generation_config.json defaults (none with generation_config="vllm"), as vLLM's LLM."""
        return self.client.default_sampling_params()

    def get_tokenizer(self):
        """The model's `tokenizers.Tokenizer`."""
        return self.client.text_codec().tokenizer

    def _seeded_iter(self, params):
        """_seeded for prompts of unknown number: one params each, drawn as they are read."""
        if self._seeds is None:
            return params
        each = iter(params) if isinstance(params, (list, tuple)) else itertools.repeat(params)
        return (self._seeded(p, 1)[0] for p in each)

    def _seeded(self, params, num_prompts: int):
        """With LLM(seed=...): a seed of its own for each request that has none."""
        if self._seeds is None:
            return params
        params = params if params is not None else self.get_default_sampling_params()
        per_prompt = params if isinstance(params, (list, tuple)) else [params] * num_prompts
        return [p if p.seed is not None or p.temperature == 0
                else msgspec.structs.replace(p, seed=self._seeds.randrange(1 << 31)) for p in per_prompt]

    def close(self) -> None:
        self.client.close()
        self.cluster.stop()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_one_prompt(prompts) -> bool:
    return isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and bool(prompts)
                                                 and isinstance(prompts[0], int))


def _prompt_list(prompts) -> list:
    return [_prompt_of(p) for p in ([prompts] if _is_one_prompt(prompts) else prompts)]


def _prompt_of(prompt):
    """vLLM's prompt dicts (TextPrompt, TokensPrompt) to a string or token ids."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return prompt["prompt"]
        raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")
    return prompt
