"""LLM: offline batch inference the way vLLM's `LLM` offers it, on a local cluster."""
from client_sdk.launcher import LocalCluster
from client_sdk.outputs import CompletionOutput
from client_sdk.sync_client import Client
from protocol.sampling import SamplingParams


class LLM:
    """Starts a scheduler and `num_workers` workers for `model` (a preset name or a model
    folder) and serves `generate` from them until `close()` (or the end of a `with`)."""

    def __init__(self, model: str = "tiny-llama", num_workers: int = 1, *, dtype: str | None = None,
                 load_format: str | None = None, kv_cache_gb: float | None = None,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 enable_prefix_caching: bool | None = None, scheduler_args: list[str] = (),
                 worker_args: list[str] = (), startup_timeout_s: float = 300.0, quiet: bool = True):
        worker_args = list(worker_args)
        for flag, value in (("--dtype", dtype), ("--load-format", load_format), ("--kv-cache-gb", kv_cache_gb)):
            if value is not None:
                worker_args += [flag, str(value)]
        scheduler_args = list(scheduler_args)
        for flag, value in (("--max-num-seqs", max_num_seqs), ("--max-num-batched-tokens", max_num_batched_tokens)):
            if value is not None:
                scheduler_args += [flag, str(value)]
        if enable_prefix_caching is not None:  # None: the scheduler's default (on for attention models)
            flag = "--enable-prefix-caching" if enable_prefix_caching else "--no-enable-prefix-caching"
            scheduler_args.append(flag)
        self.cluster = LocalCluster(model, num_workers, scheduler_args=scheduler_args, worker_args=worker_args,
                                    quiet=quiet).start(startup_timeout_s)
        try:
            self.client = Client(self.cluster.address)
            self.cluster.wait_for_workers(self.client, num_workers, startup_timeout_s)
        except BaseException:
            self.cluster.stop()
            raise

    def generate(self, prompts, params: SamplingParams | None = None, *, use_tqdm: bool = False,
                 window: int | None = None) -> list[CompletionOutput]:
        single = isinstance(prompts, str) or (prompts and isinstance(prompts[0], int))
        outputs = self.client.generate_batch([prompts] if single else list(prompts), params, progress=use_tqdm,
                                             window=window)
        return outputs

    def close(self) -> None:
        self.client.close()
        self.cluster.stop()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
