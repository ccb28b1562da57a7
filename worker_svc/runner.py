"""ModelRunner: executes the scheduler's incremental step plans on one model.

It keeps, per request it holds, the token ids, the number of computed tokens, the block table
and the sampling parameters, in preallocated numpy tables indexed by a row per request, so
building a step's inputs is a handful of vectorised gathers, never a Python loop per token.

A step, in order: free finished and preempted requests; swap out, swap in, copy blocks; register
new requests; append running requests' new blocks; one forward; sample the sequences whose
computed tokens reached the end of their known tokens; append the sampled tokens.

Inside a step the sequences run decodes first (attention.py's layout), and the token axis is
padded to a bucket (model_executor.py); results go back in the plan's order.

Tensor parallel: every rank of a group runs the same plans on its shard of the model and KV
cache; rank 0 samples and broadcasts the token ids, so every rank appends the same tokens.

Every phase of a step reads and writes the same request tables, so they share this class; what
stands alone lives beside it (request_table.py, logits_processors.py, structured_outputs.py,
prompt_logprobs.py, sampler.py, model_executor.py).
"""
import logging
from itertools import chain
from operator import attrgetter

import numpy as np
import torch
from tokenizers import Tokenizer

from protocol.worker_messages import StepPlan, StepResult, WorkerHello
from worker_svc import compile_cache, cpu_threads, cuda_graphs, huge_pages, kv_cache, linear_kernel, malloc_policy, status
from worker_svc.attention import build_attention_metadata
from worker_svc.encoder_attention import build_encoder_metadata
from worker_svc.forward_context import ForwardContext, forward_context
from worker_svc.loader import load_model
from worker_svc.logits_processors import LogitsProcessors
from worker_svc.model_executor import ModelExecutor
from worker_svc.model_source import resolve_model
from worker_svc.models.rotary import max_model_len
from worker_svc.models.state_layout import StateLayout
from worker_svc.parallel import TensorParallel, init_process_group
from worker_svc.pooling import Pooler
from worker_svc.pooling_config import pooling_info, resolve_task
from worker_svc.prompt_logprobs import score_prompts
from worker_svc.request_table import RequestTable, StepInputs
from worker_svc.runner_config import RunnerConfig
from worker_svc.sampler import SamplingMetadata, sample
from worker_svc.state_slots import StateSlotPool
from worker_svc.structured_outputs import StructuredOutputs

log = logging.getLogger(__name__)
_request_id, _new_block_ids = attrgetter("request_id"), attrgetter("new_block_ids")
_num_new_tokens = attrgetter("num_new_tokens")
_GiB = 1 << 30


class ModelRunner:
    def __init__(self, config: RunnerConfig):
        self.config = config
        self._load_model()
        self._read_model_facts()
        if self.pooling is not None:  # else host memory grows with the step sizes seen (malloc_policy.py)
            malloc_policy.map_large_blocks()
        self._size_kv_cache()
        self._allocate_caches()
        self.requests = self._make_request_table()
        self.executor = self._make_executor()
        self._warm_up()

    def _load_model(self) -> None:
        """Loads this rank's shard, joins the tensor-parallel group, sets the CPU threads."""
        config = self.config
        self.tp = TensorParallel(config.tensor_parallel_size, config.rank)
        # Load before joining the group: a model that cannot be sharded fails at once.
        self.source = source = resolve_model(config.model, config.revision, config.download_dir, config.load_format)
        self.loaded = load_model(source, dtype=config.dtype, device=config.device,
                                 load_format=config.load_format, seed=config.seed, tp=self.tp,
                                 generation_config=config.generation_config, name=config.model)
        init_process_group(self.tp, config.dist_init_address, self.loaded.device)
        self.model, self.device, self.dtype = self.loaded.model, self.loaded.device, self.loaded.dtype
        if self.device.type == "cpu":
            huge_pages.move_weights(self.model)
        cpu_threads.choose_threads(source, self.device, config.threads)  # before compiling

    def _read_model_facts(self) -> None:
        """What the steps need of the model: its vocabulary, its longest sequence, its rotary
        embedding where that takes sequence lengths, and what it pools if it is a pooling model."""
        config, model_config = self.config, self.loaded.config
        self.vocab_size = model_config["vocab_size"]
        self.max_model_len = (config.max_model_len or getattr(self.model, "max_positions", None)
                              or max_model_len(model_config))
        self.pooling = pooling_info(resolve_task(config.task, self.source, model_config), self.source,
                                    model_config, config.pooling_type, config.normalize)
        self.pooler = Pooler(self.pooling, self.model) if self.pooling is not None else None
        self.bidirectional = getattr(self.model, "bidirectional", False)  # an encoder (models/bert.py)
        # A rotary embedding whose frequencies depend on a sequence length (models/rotary.py)
        rotary = getattr(self.model, "rotary", None)
        self.rotary = rotary if getattr(rotary, "uses_lengths", False) else None

    def _size_kv_cache(self) -> None:
        """How many KV blocks this worker holds on the device (the fewest any rank fits) and on
        the host (swap space)."""
        config = self.config
        self.block_size = config.block_size
        self.spec = self.model.cache_spec()  # this rank's KV heads only
        self.num_gpu_blocks = config.num_gpu_blocks
        if self.num_gpu_blocks is None:
            self.num_gpu_blocks = self.tp.min_over_ranks(kv_cache.num_device_blocks(
                self.spec, self.block_size, self.dtype, self.device, config.kv_cache_gb,
                config.gpu_memory_utilization), self.device)
        if self.spec.num_attention_layers == 0 and config.num_gpu_blocks is None:
            # No KV to hold (a state model, an encoder): blocks become pure bookkeeping (no
            # memory), enough for every state slot (--num-state-slots sequences, for an encoder)
            # to reach max_model_len, so the state-slot cap, or the step's budget, limits the batch.
            self.num_gpu_blocks = config.num_state_slots * kv_cache.num_blocks_for_tokens(
                self.max_model_len, self.block_size)
        self.num_cpu_blocks = kv_cache.num_blocks_for_bytes(
            config.swap_space_gb * _GiB, self.spec, self.block_size, self.dtype)

    def _allocate_caches(self) -> None:
        """The device KV cache and state slots, and the host blocks that swapped-out KV goes to."""
        # One block more than the scheduler is told of: the scratch block, where padding tokens
        # write their K/V.
        self.caches = kv_cache.ModelCaches(kv=kv_cache.allocate_kv(
            self.spec, self.num_gpu_blocks + 1, self.block_size, self.dtype, self.device))
        self.scratch_slot = self.num_gpu_blocks * self.block_size
        self.cpu_kv = kv_cache.allocate_kv(self.spec, self.num_cpu_blocks, self.block_size,
                                           self.dtype, torch.device("cpu"),
                                           pin_memory=self.device.type == "cuda")
        self.num_state_slots = self.config.num_state_slots if self.spec.has_state else 0
        self.caches.conv, self.caches.ssm = kv_cache.allocate_state(
            self.spec, self.num_state_slots, self.dtype, self.device)
        self.state_slots = StateSlotPool(self.num_state_slots)

    def _make_request_table(self) -> RequestTable:
        return RequestTable(self.max_model_len, self.block_size,
                            self.loaded.eos_token_ids,
                            LogitsProcessors(self.vocab_size, self.device, self._tokenizer()),
                            StructuredOutputs(self.loaded.tokenizer_json, self.vocab_size,
                                              self.loaded.eos_token_ids),
                            uses_blocks=self.spec.num_attention_layers > 0)

    def _warm_up(self) -> None:
        """Compiles the step (model_executor.warm_up) and captures the CUDA decode graphs before
        the first request, so that it pays for neither."""
        if self.executor.compiled:
            status.say(f"compiling the model's step (torch.compile): the first start takes longer, later ones "
                       f"reuse {compile_cache.root()} (--enforce-eager skips compiling)")
        with torch.inference_mode():
            self.warm_up_s = self.executor.warm_up(self._padding_forward)
            # rope lengths: a per-step tensor; an encoder has no decodes
            if self.executor.compiled and self.rotary is None and not self.bidirectional:
                self.executor.decode_graphs = cuda_graphs.capture_decode_graphs(
                    self.executor.compiled_forward, self.caches, self.device,
                    self.config.max_cudagraph_capture_size, self.max_model_len, self.block_size,
                    self.scratch_slot)

    def _tokenizer(self):
        """The model's tokenizer as text -> ids (no special tokens), or None if it has none."""
        if self.loaded.tokenizer_json is None:
            return None
        tokenizer = Tokenizer.from_str(self.loaded.tokenizer_json)
        return lambda text: tokenizer.encode(text, add_special_tokens=False).ids

    def _make_executor(self) -> ModelExecutor:
        config = self.config
        compile_model = not config.enforce_eager
        if compile_model and not getattr(self.model, "supports_compile", False):
            log.info("%s runs eagerly: it is not written for torch.compile", self.loaded.name)
            compile_model = False
        if compile_model and self.tp.size > 1:
            log.info("tensor-parallel ranks run eagerly (collectives are not compiled)")
            compile_model = False
        compile_cache.configure(config.compile_cache_dir)
        if self.device.type == "cpu":
            linear_kernel.load()  # the step kernels: the attention's too
        return ModelExecutor(self.model, self.device, compile_model)

    def _padding_forward(self, num_tokens: int, greedy_indices: np.ndarray | None = None) -> torch.Tensor:
        """A forward of padding tokens only (they touch nothing but the scratch block)."""
        no_seqs = np.zeros(0, dtype=np.int64)
        inputs = StepInputs.empty(num_tokens, self.scratch_slot)
        context = self._forward_context(inputs, no_seqs, no_seqs)
        with forward_context(context):
            return self.executor.forward(*self._token_tensors(inputs), greedy_indices)[0]

    # ---- the step ------------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one plan; a failure becomes StepResult(error=...), the worker keeps serving."""
        try:
            with torch.inference_mode():
                return self._execute(plan)
        except Exception as exc:  # noqa: BLE001 - reported to the scheduler, which fails the step
            log.exception("step %d failed", plan.step_id)
            return StepResult(step_id=plan.step_id, sampled_token_ids=[],
                              error=f"{type(exc).__name__}: {exc}")

    def _execute(self, plan: StepPlan) -> StepResult:
        if plan.finished_ids or plan.preempted_ids:
            self._free([*plan.finished_ids, *plan.preempted_ids])
        kv_cache.swap_blocks(self.caches.kv, self.cpu_kv, plan.blocks_to_swap_out)
        kv_cache.swap_blocks(self.cpu_kv, self.caches.kv, plan.blocks_to_swap_in)
        kv_cache.swap_blocks(self.caches.kv, self.caches.kv, plan.blocks_to_copy)
        news, running = plan.new_requests, plan.running_requests
        if not news and not running:
            return StepResult(step_id=plan.step_id, sampled_token_ids=[])
        if self.spec.has_state and any(new.num_computed_tokens > 0 for new in news):
            # Swap moves KV blocks, not Mamba state: state models must be preempted by recompute.
            resumed = next(new for new in news if new.num_computed_tokens > 0)
            raise ValueError(f"{resumed.request_id} resumes at token {resumed.num_computed_tokens}, "
                             "but a state model's requests can only restart from zero")
        if news:
            self._check_kinds(news)
            self._free([new.request_id for new in news])  # a resumed request replaces whatever we held
        new_rows = self.requests.add(news)
        if self.spec.has_state:
            for new, row in zip(news, new_rows.tolist()):
                self._take_state_slot(new.request_id, row)
        running_rows = self.requests.rows_of(map(_request_id, running))
        self.requests.append_blocks(running_rows, list(map(_new_block_ids, running)))
        query_lens = np.fromiter(map(_num_new_tokens, chain(news, running)), np.int64, len(news) + len(running))
        return self._run(plan.step_id, np.concatenate([new_rows, running_rows]), query_lens)

    def _check_kinds(self, news) -> None:
        """A pooling model serves pooling requests of its task, a generative model the others:
        the scheduler sends no other (it reads the hello); this says which was wrong if it did."""
        task = self.pooling.task if self.pooling is not None else None
        for new in news:
            asked = new.pooling.task if new.pooling is not None else None
            if asked != task:
                raise ValueError(f"{new.request_id} asks for {asked or 'generation'}, but this worker's model "
                                 f"serves {task or 'generation'}")

    def _run(self, step_id: int, rows: np.ndarray, query_lens: np.ndarray) -> StepResult:
        """rows, query_lens in plan order; the step runs decodes first, results in plan order."""
        if self.rotary is not None and self.rotary.recompute_past is not None:
            self._recompute_crossing_rows(rows, query_lens, self.rotary.recompute_past)
        order = np.argsort(query_lens != 1, kind="stable")
        rows, query_lens = rows[order], query_lens[order]
        inputs, context = self._prepare(rows, query_lens)
        sampled = inputs.sampled_mask  # [B] bool
        meta = None  # a tensor-parallel group's rank 0 builds it in _sample, after the forward
        if sampled.any() and self.tp.size == 1:
            meta = self.requests.sampling_metadata(rows[sampled])
        greedy_indices = inputs.logits_indices if meta is not None and meta.argmax_only else None
        with forward_context(context):
            hidden, tokens = self.executor.forward(*self._token_tensors(inputs), greedy_indices)  # [T, hidden]
        logprobs, errors = None, {}
        if tokens is None:
            tokens = np.empty(0, dtype=np.int64)
            if sampled.any():
                logits_indices = torch.from_numpy(inputs.logits_indices).to(self.device)
                tokens, logprobs, errors = self._sample(hidden[logits_indices], rows[sampled], meta)
        prompt_logprobs = self._score_prompts(hidden, rows, query_lens, order)
        pooled, pooling_errors = self._pool(hidden, inputs, rows, query_lens, order)
        # A request that failed alone (its grammar) reports no token, but its row keeps a
        # placeholder: a plan already in flight for it (async scheduling) still finds the tokens
        # it counts on; the scheduler has ended the request and ignores what that plan gives it.
        self.requests.advance(rows, query_lens, rows[sampled], np.maximum(tokens, 0))
        out = np.full(len(rows), -1, dtype=np.int64)
        out[order[sampled]] = tokens
        if logprobs is not None:
            aligned = [None] * len(rows)
            for i, lp in zip(order[sampled].tolist(), logprobs):
                aligned[i] = lp
            logprobs = aligned
        request_errors = {int(order[sampled][i]): reason for i, reason in errors.items()} | pooling_errors
        return StepResult(step_id=step_id, sampled_token_ids=out.tolist(), logprobs=logprobs,
                          request_errors=request_errors, prompt_logprobs=prompt_logprobs, pooled=pooled)

    def _pool(self, hidden: torch.Tensor, inputs: StepInputs, rows: np.ndarray, query_lens: np.ndarray,
              order: np.ndarray) -> tuple[dict[int, bytes], dict[int, str]]:
        """The vectors of this step's pooling requests (rank 0 answers) and their errors, keyed
        by plan index."""
        if not inputs.pooled_mask.any() or not self.tp.is_driver:
            return {}, {}
        pooled_at = np.flatnonzero(inputs.pooled_mask)
        params = [self.requests.pooling[row] for row in rows[pooled_at].tolist()]
        vectors, errors = self.pooler.pool(hidden, inputs.query_start_loc[pooled_at], query_lens[pooled_at], params)
        plan_index = order[pooled_at].tolist()
        return ({plan_index[j]: vector for j, vector in enumerate(vectors) if vector is not None},
                {plan_index[j]: reason for j, reason in errors.items()})

    def _score_prompts(self, hidden: torch.Tensor, rows: np.ndarray, query_lens: np.ndarray, order: np.ndarray):
        """Prompt logprobs of this step's prompt chunks (rank 0 answers), keyed by plan index."""
        table = self.requests
        if not table.scoring_rows or not self.tp.is_driver:
            return {}
        num_logprobs = table.num_prompt_logprobs[rows]
        scored = score_prompts(self.executor.logits, hidden, table.token_ids, rows, table.num_prompt[rows],
                               table.num_computed[rows], query_lens, num_logprobs)
        return {int(order[j]): chunk for j, chunk in scored.items()}

    def _recompute_crossing_rows(self, rows: np.ndarray, query_lens: np.ndarray, length: int) -> None:
        """Requests whose sequence passes `length` in this step compute again from token 0 (their
        K/V so far used the other rotary frequencies): Phi-3's longrope, as its generate does."""
        num_computed = self.requests.num_computed[rows]
        crossing = (num_computed > 0) & (num_computed <= length) & (num_computed + query_lens > length)
        if crossing.any():
            query_lens[crossing] += num_computed[crossing]
            self.requests.num_computed[rows[crossing]] = 0

    def _prepare(self, rows: np.ndarray, query_lens: np.ndarray) -> tuple[StepInputs, ForwardContext]:
        """The step's inputs (numpy) and forward context (metadata tensors), decodes first."""
        inputs = self.requests.prepare_inputs(
            rows, query_lens, self.executor.padded_size(int(query_lens.sum())), self.scratch_slot)
        return inputs, self._forward_context(inputs, rows, query_lens)

    def _forward_context(self, inputs: StepInputs, rows: np.ndarray,
                         query_lens: np.ndarray) -> ForwardContext:
        context = ForwardContext(caches=self.caches)
        if self.spec.num_attention_layers:
            context.attn_metadata = build_attention_metadata(
                query_lens, inputs.num_computed_tokens, inputs.block_tables, inputs.slot_mapping,
                self.block_size, self.device)
        if self.rotary is not None:
            context.rope_lengths = self._rope_lengths(inputs, rows, query_lens)
        if self.spec.has_state:
            context.state_layout = StateLayout.build(
                query_lens, inputs.num_computed_tokens, self.requests.state_slot[rows], self.device)
        if self.bidirectional:
            context.encoder_metadata = build_encoder_metadata(query_lens, self.device)
            context.token_type_ids = self._token_type_ids(inputs, rows, query_lens)
        return context

    def _token_type_ids(self, inputs: StepInputs, rows: np.ndarray, query_lens: np.ndarray) -> torch.Tensor | None:
        """[T]: each token's segment id (PoolingParams.token_type_ids); None: all zeros."""
        pooling = self.requests.pooling
        typed = [i for i, row in enumerate(rows.tolist())
                 if row in pooling and pooling[row].token_type_ids is not None]
        if not typed:
            return None
        ids = np.zeros(len(inputs.positions), dtype=np.int64)
        for i in typed:
            types = pooling[int(rows[i])].token_type_ids
            if len(types) != query_lens[i]:
                raise ValueError(f"{len(types)} token_type_ids for a prompt of {query_lens[i]} tokens")
            if max(types, default=0) >= self.model.type_vocab_size:
                raise ValueError(f"token_type_ids up to {max(types)}; the model has {self.model.type_vocab_size} types")
            start = inputs.query_start_loc[i]
            ids[start:start + len(types)] = types
        return torch.from_numpy(ids).to(self.device, non_blocking=True)

    def _rope_lengths(self, inputs: StepInputs, rows: np.ndarray, query_lens: np.ndarray) -> torch.Tensor:
        """[T]: each token's rope length (models/rotary.py): max(anchor, position + 1), the anchor
        being its request's prompt length, or its whole length after this step (Phi-3)."""
        if self.rotary.length_anchor == "sequence":
            anchors = inputs.num_computed_tokens + query_lens
        else:
            anchors = self.requests.num_prompt[rows]
        num_tokens = int(query_lens.sum())
        lengths = np.ones(len(inputs.positions), dtype=np.int64)  # padding: any valid length
        lengths[:num_tokens] = np.maximum(np.repeat(anchors, query_lens), inputs.positions[:num_tokens] + 1)
        return torch.from_numpy(lengths).to(self.device, non_blocking=True)

    def _token_tensors(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.from_numpy(inputs.input_ids).to(self.device, non_blocking=True),
                torch.from_numpy(inputs.positions).to(self.device, non_blocking=True))

    def _sample(self, hidden: torch.Tensor, rows: np.ndarray, meta: SamplingMetadata | None):
        """hidden: [S, hidden] -> token ids [S], the same on every rank, and rank 0's logprobs.

        Only rank 0 computes logits and samples (the others' would be identical work), then
        broadcasts the ids: exact for seeded and unseeded random sampling alike. meta: the rows'
        SamplingMetadata where the runner built it before the forward (a worker alone, whose
        all-greedy steps take their tokens from the forward's graph); None: built here. Rows
        that fail alone (a grammar that does not compile) get token -1 and a reason (index -> str)."""
        tokens, logprobs, errors = None, None, {}
        if self.tp.is_driver:
            try:
                meta = meta if meta is not None else self.requests.sampling_metadata(rows)
                tokens, logprobs = sample(self.executor.logits(hidden), meta)
                if meta.grammar is not None and meta.grammar.errors:
                    errors = meta.grammar.errors
                    tokens[list(errors)] = -1
            finally:  # on failure too, so the other ranks are not left waiting
                tokens = self.tp.broadcast_tokens(tokens, len(rows), self.device)
        else:
            tokens = self.tp.broadcast_tokens(None, len(rows), self.device)
        return tokens, logprobs, errors

    # ---- request state ----------------------------------------------------------------------

    def _free(self, request_ids: list[str]) -> None:
        self.requests.remove(request_ids)
        if self.spec.has_state:
            for request_id in request_ids:
                self.state_slots.free(request_id)

    def _take_state_slot(self, request_id: str, row: int) -> None:
        slot = self.state_slots.allocate(request_id)
        self.requests.state_slot[row] = slot
        for conv, ssm in zip(self.caches.conv, self.caches.ssm):
            conv[slot].zero_()  # a reused slot must not leak the previous request's state
            ssm[slot].zero_()

    # ---- info --------------------------------------------------------------------------------

    def hello(self, worker_id: str, group_id: str = "") -> WorkerHello:
        """group_id: shared by the ranks of a tensor-parallel group; "" for a worker alone."""
        return WorkerHello(
            worker_id=worker_id, model=self.loaded.name, device=str(self.device),
            dtype=self.loaded.dtype_name, vocab_size=self.vocab_size,
            max_model_len=self.max_model_len, block_size=self.block_size,
            num_gpu_blocks=self.num_gpu_blocks, num_cpu_blocks=self.num_cpu_blocks,
            num_state_slots=self.num_state_slots, eos_token_ids=self.loaded.eos_token_ids,
            tokenizer_json=self.loaded.tokenizer_json,
            tensor_parallel_size=self.tp.size, rank=self.tp.rank, group_id=group_id,
            chat_template=self.loaded.chat_template, special_tokens=self.loaded.special_tokens,
            compiled=self.executor.compiled, sampling_defaults=self.loaded.sampling_defaults,
            pooling=self.pooling)

    def stats(self) -> dict[str, int]:
        """Field names of protocol Heartbeat: Heartbeat(worker_id=..., **runner.stats())."""
        return {"num_kv_blocks_in_use": self.requests.num_blocks_in_use,
                "num_state_slots_in_use": self.state_slots.num_in_use,
                "num_requests": self.requests.num_requests}

    def check_integrity(self) -> None:
        """Idle check: every held request of a state model owns exactly one slot."""
        self.state_slots.check_integrity()
        if self.spec.has_state:
            assert self.state_slots.num_in_use == self.requests.num_requests, "state slots leaked"
