"""ModelExecutor: the model's forward and LM head, compiled (the default) or eager.

Compiled means torch.compile with the inductor backend, weights frozen (folded in as constants)
and the number of tokens dynamic: one compile at start-up serves every batch of decodes,
prefills and mixes (two graphs of the forward: with the greedy head, and for steps with no
greedy rows without it). Token counts past a bucket (8) are padded to a multiple of it, and
smaller ones to at least 2, which keeps 0- and 1-sized dimensions (which torch specialises on)
out of the graph; a decode step of a few sequences then computes no padding rows, each of which
would cost a pass over every weight. On the CPU the linear layers are one opaque op
(linear_kernel.py: its own kernel up to 8 rows, oneDNN's GEMM on weights packed once past it); so
are the attention and state layers (attention.py), and the experts of a mixture
(models/sparse_moe.py: routing decides which rows each expert takes, but not the op's output
shape, so routing never recompiles).

Dimensions get a symbol each (no "duck shaping"): otherwise a batch of 256 rows of a
256-wide hidden state would share one symbol with the weight's in-features and be specialised
to 256, which also sends float32 matmuls back to MKL.

A step whose sampled rows are all greedy without logprobs gets their tokens from the forward's
own graph (greedy_head.py: the LM head and the argmax after the model). On CUDA, batches of
decodes replay CUDA graphs of the compiled forward (cuda_graphs.py).

Models that are not written for compilation (state-space models: their scans loop in Python
over the step's sequence groups) and tensor-parallel ranks (collectives inside the graph) run
eagerly, and say so in the log.
"""
import logging
import time

import numpy as np
import torch

from worker_svc import linear_kernel
from worker_svc.greedy_head import ForwardWithGreedyHead
from worker_svc.sampler import argmax_rows

log = logging.getLogger(__name__)
TOKEN_BUCKET = 8  # token counts past it are padded to a multiple of it
# From this size of weights a CPU model's graph makes its calls (its fused kernels, the linear and
# attention ops) from C++ rather than from inductor's Python wrapper: 2.5-3% of a decode step at
# batch 1 (Qwen3-0.6B and tiny-llama, bfloat16, 2-vCPU AMD EPYC, alternating in one process), for
# ~10 s more of start-up per model (the wrapper is C++ to build and load): a real-size model's
# start-up takes minutes anyway, the small ones of the tests would take twice as long.
CPP_WRAPPER_FROM_BYTES = 256 << 20
SERIAL_CHUNK = 1 << 40  # inductor's smallest share of a kernel a thread takes: none is ever split

_num_compilations = 0


def _count_compilation(_args) -> None:
    global _num_compilations
    _num_compilations += 1


torch._dynamo.callback.callback_handler.register_start_callback(_count_compilation)


def num_compilations() -> int:
    """Graphs torch.compile has compiled in this process so far (recompilations included)."""
    return _num_compilations


def _parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def padded_size(num: int) -> int:
    """Up to a bucket, the count itself (at least 2): a decode step of a few sequences computes
    no padding rows, each of which the linear layers' kernel would multiply with every weight."""
    if num <= TOKEN_BUCKET:
        return max(2, num)
    return -(-num // TOKEN_BUCKET) * TOKEN_BUCKET


class ModelExecutor:
    def __init__(self, model: torch.nn.Module, device: torch.device, compile_model: bool):
        self.model, self.device = model, device
        # A pooling encoder (models/bert.py) has no LM head: its graph is the forward alone.
        self.has_head = hasattr(model, "compute_logits")
        self._forward, self._logits = model, getattr(model, "compute_logits", None)
        self.compiled = False
        # cuda_graphs.DecodeGraphs, set by the runner after warm_up on CUDA; None: never replays
        self.decode_graphs = None
        if compile_model:
            import torch._dynamo.config as dynamo_config
            import torch._inductor.config as inductor_config
            import torch.fx.experimental._config as fx_config
            inductor_config.freezing = True
            # The fused elementwise kernels run on the calling thread: inductor decides a kernel's
            # threads once, from the compile-time token count, and a kernel forked over threads
            # for a decode step's few rows cost a wake-up per kernel (the worker's OpenMP
            # threads wait passively) for a microsecond of work. A prefill's wide kernels lose
            # little against the GEMMs beside them.
            inductor_config.cpp.min_chunk_size = SERIAL_CHUNK
            inductor_config.cpp_wrapper = device.type == "cpu" and _parameter_bytes(model) >= CPP_WRAPPER_FROM_BYTES
            fx_config.use_duck_shape = False
            dynamo_config.specialize_float = True
            dynamo_config.guard_nn_modules = False
            dynamo_config.use_recursive_dict_tags_for_guards = True
            # Every executor compiles the same code objects (its model class's forward,
            # ForwardWithGreedyHead.forward) for weights of its own: one cache entry each, not a recompile
            # of a shape. A worker builds one; a process that builds more (the tests, a program
            # running ModelRunners in-process) met dynamo's limit of 8 entries per code object
            # and, with fullgraph, failed at the ninth.
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
            linear_kernel.pack_weights(model)  # what inductor's freezing packed before, once for every graph
            compile = lambda fn: torch.compile(fn, dynamic=True, fullgraph=True)  # noqa: E731
            self._forward = compile(ForwardWithGreedyHead(model) if self.has_head else model)
            # A step with no greedy rows passes none: torch.compile specialises a dimension of
            # size 0, so that step runs a graph of its own, without the head.
            self._no_rows = torch.zeros(0, dtype=torch.int64, device=device)
            self._logits = compile(model.compute_logits) if self.has_head else None
            self.compiled = True

    def padded_size(self, num_tokens: int) -> int:
        """The token axis a forward of num_tokens runs on: a bucket when compiled."""
        return padded_size(num_tokens) if self.compiled else num_tokens

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                greedy_indices: np.ndarray | None = None) -> tuple[torch.Tensor, np.ndarray | None]:
        """input_ids, positions: [T], T = padded_size(real tokens) -> hidden [T, hidden], and
        with greedy_indices [S] (rows of hidden) their argmax token ids [S] (ties: lowest id),
        as unfused logits give."""
        if self.decode_graphs is not None:
            hidden = self.decode_graphs.replay(input_ids, positions)
            if hidden is not None:
                return hidden, self._argmax_of_logits(hidden, greedy_indices)
        if not self.compiled or not self.has_head:
            hidden = self._forward(input_ids, positions)
            return hidden, self._argmax_of_logits(hidden, greedy_indices)
        if greedy_indices is None:  # no head: the graph compiled for zero rows skips it
            hidden, _ = self._forward(input_ids, positions, self._no_rows)
            return hidden, None
        num = len(greedy_indices)
        indices = np.zeros(padded_size(num), dtype=np.int64)  # padding rows: row 0, ignored
        indices[:num] = greedy_indices
        hidden, tokens = self._forward(input_ids, positions, torch.from_numpy(indices).to(self.device))
        return hidden, tokens[:num].cpu().numpy()

    def _argmax_of_logits(self, hidden: torch.Tensor, greedy_indices: np.ndarray | None) -> np.ndarray | None:
        """The greedy tokens of a forward that ran without its head (eager, a CUDA graph's replay)."""
        if greedy_indices is None:
            return None
        return argmax_rows(self.logits(hidden[torch.from_numpy(greedy_indices).to(self.device)]))

    @property
    def compiled_forward(self):
        """The compiled forward alone, (input_ids, positions) -> hidden, what a CUDA graph
        captures (the graph for zero greedy rows: no head); the eager model if not compiled."""
        if not self.compiled or not self.has_head:
            return self._forward
        return lambda input_ids, positions: self._forward(input_ids, positions, self._no_rows)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden] -> logits [S, vocab] in the model's dtype (model.compute_logits)."""
        return self._logits(self._pad_rows(hidden))[:hidden.shape[0]]

    def _pad_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        num = hidden.shape[0]
        padded = self.padded_size(num)
        if padded == num:
            return hidden
        return torch.cat([hidden, hidden.new_zeros(padded - num, hidden.shape[1])])

    def warm_up(self, run_forward) -> float:
        """Compiles every function on dummy shapes before the first request; the seconds it took.
        run_forward(num_tokens, greedy_indices=None) runs one all-padding forward through the
        runner's own path and returns its hidden states.
        A compiler that fails here (no C++ toolchain, an unsupported op) leaves the worker
        serving eagerly rather than not at all."""
        if not self.compiled:
            return 0.0
        start = time.perf_counter()
        try:
            hidden = run_forward(2 * TOKEN_BUCKET)  # a step that samples, or samples nothing
            if self.has_head:
                run_forward(2 * TOKEN_BUCKET, np.arange(TOKEN_BUCKET))  # an all-greedy step: the head in the graph
                self.logits(hidden)
        except Exception:
            log.exception("torch.compile failed; the model runs eagerly")
            self._forward, self._logits = self.model, getattr(self.model, "compute_logits", None)
            self.compiled = False
            return 0.0
        seconds = time.perf_counter() - start
        log.info("model compiled in %.1f s (%d graphs)", seconds, num_compilations())
        return seconds

