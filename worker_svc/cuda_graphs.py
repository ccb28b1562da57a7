"""DecodeGraphs: CUDA graphs of the compiled step for batches of decodes only.

On a GPU a decode step of a small model is mostly kernel launches: a graph replays them in one.
At start-up, after the compiled step is warm, one graph is captured per padded batch size (every
bucket of model_executor.py up to --max-cudagraph-capture-size, largest first, all in one memory
pool); a step whose tokens are all decodes copies its inputs into the graphs' static buffers and
replays the graph of its size. Steps with a prefill, or larger than the largest graph, run the
compiled step as before. Nothing here runs on CPU workers, nor with --enforce-eager, nor for
models whose forward reads a per-step tensor a graph cannot hold (rotary lengths, Mamba state;
state models and tensor-parallel ranks run eagerly anyway).

What a graph records is the forward over StaticDecodeInputs: the token ids, positions and an
AttentionMetadata whose tensors are views of fixed buffers, with the block tables max_model_len
wide (the decode kernels read only the blocks under each context length). A replay makes the
buffers say this step: real rows copied in, and the rest of the bucket turned into padding that
writes its K/V to the scratch slot and attends to one scratch key. Stale rows of an earlier,
larger step would otherwise write their K/V into blocks that requests own now.
"""
import bisect
import logging
import time

import torch

from worker_svc import triton_decode
from worker_svc.attention import AttentionMetadata
from worker_svc.forward_context import ForwardContext, forward_context, get_forward_context
from worker_svc.model_executor import TOKEN_BUCKET

log = logging.getLogger(__name__)


def capture_sizes(max_size: int) -> list[int]:
    """The batch sizes graphs are captured for: every bucket (a multiple of TOKEN_BUCKET) up to
    max_size, so a step's padded size is a graph's size and needs no more padding."""
    return list(range(TOKEN_BUCKET, max_size + 1, TOKEN_BUCKET))


class StaticDecodeInputs:
    """The buffers a captured decode step reads, and the copy of one step's inputs into them."""

    def __init__(self, max_size: int, max_blocks: int, scratch_slot: int, block_size: int,
                 device: torch.device):
        self.scratch_slot, self.scratch_block = scratch_slot, scratch_slot // block_size
        int64 = dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(max_size, **int64)  # [max_size]
        self.positions = torch.zeros(max_size, **int64)
        self.slot_mapping = torch.full((max_size,), scratch_slot, **int64)
        self.block_tables = torch.full((max_size, max_blocks), self.scratch_block, **int64)
        self.context_lens = torch.ones(max_size, **int64)

    def metadata(self, size: int) -> AttentionMetadata:
        """A batch of `size` decodes over the buffers' first `size` rows."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], num_tokens=size, num_decode_tokens=size,
            decode_block_tables=self.block_tables[:size], decode_context_lens=self.context_lens[:size],
            prefill=None)

    def fits(self, meta: AttentionMetadata) -> bool:
        """Whether a step of this metadata is decodes only and fits the buffers."""
        return (meta.prefill is None and meta.num_decode_tokens == meta.num_tokens
                and meta.decode_block_tables.shape[1] <= self.block_tables.shape[1])

    def fill(self, size: int, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> None:
        """Rows [0, num_decode) become the step's decodes; the rest of [0, size), padding."""
        num_tokens, num_decode = input_ids.shape[0], meta.num_decode_tokens  # padded, real
        width = meta.decode_block_tables.shape[1]
        self.input_ids[:num_tokens].copy_(input_ids)
        self.positions[:num_tokens].copy_(positions)
        self.slot_mapping[:num_tokens].copy_(meta.slot_mapping)  # its padding: the scratch slot
        self.slot_mapping[num_tokens:size].fill_(self.scratch_slot)
        self.block_tables[:num_decode, :width].copy_(meta.decode_block_tables)
        self.block_tables[num_decode:size, 0].fill_(self.scratch_block)
        self.context_lens[:num_decode].copy_(meta.decode_context_lens)
        self.context_lens[num_decode:size].fill_(1)


class DecodeGraphs:
    """One CUDA graph per capture size of `forward` (the compiled step) over StaticDecodeInputs."""

    def __init__(self, forward, caches, inputs: StaticDecodeInputs, sizes: list[int]):
        self.forward, self.caches, self.inputs, self.sizes = forward, caches, inputs, sizes
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # size -> graph, its output
        self.num_replays = 0

    def forward_static(self, size: int) -> torch.Tensor:
        """The forward a graph of `size` records: hidden [size, hidden] from the buffers."""
        context = ForwardContext(caches=self.caches, attn_metadata=self.inputs.metadata(size))
        with forward_context(context):
            return self.forward(self.inputs.input_ids[:size], self.inputs.positions[:size])

    def capture(self) -> float:
        """Captures every size, largest first (the pool then fits them all); the seconds it took."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            self.forward_static(size)  # outside the graph: lazy initialisation, autotuning
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self.forward_static(size)
            self.graphs[size] = (graph, hidden)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def size_for(self, num_tokens: int) -> int | None:
        """The smallest capture size holding num_tokens, None past the largest."""
        index = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[index] if index < len(self.sizes) else None

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
        """hidden [T, hidden] for this step (inside its forward context) by a graph's replay, or
        None where no graph applies. The tensor is the graph's own output: read it before the
        next replay (the runner samples from it within the step)."""
        context = get_forward_context()
        meta = context.attn_metadata
        if meta is None or context.rope_lengths is not None or context.state_layout is not None:
            return None
        size = self.size_for(input_ids.shape[0])
        if size is None or not self.inputs.fits(meta):
            return None
        self.inputs.fill(size, input_ids, positions, meta)
        self.num_replays += 1
        return self._replay(size)[:input_ids.shape[0]]

    def _replay(self, size: int) -> torch.Tensor:
        """hidden [size, hidden] of the buffers, by the graph of `size`."""
        graph, hidden = self.graphs[size]
        graph.replay()
        return hidden


def capture_decode_graphs(forward, caches, device: torch.device, max_size: int, max_model_len: int,
                          block_size: int, scratch_slot: int) -> DecodeGraphs | None:
    """DecodeGraphs of the compiled `forward` on a CUDA device, captured; None where graphs do not
    apply (not CUDA, max_size 0, no Triton decode kernel: the torch fallback would gather every
    column of a max_model_len-wide table) or the capture failed (logged: the step runs
    without graphs, as with max_size 0)."""
    sizes = capture_sizes(max_size)
    if device.type != "cuda" or not sizes or triton_decode.load() is None:
        return None
    max_blocks = -(-max_model_len // block_size)
    graphs = DecodeGraphs(forward, caches, StaticDecodeInputs(sizes[-1], max_blocks, scratch_slot,
                                                              block_size, device), sizes)
    try:
        seconds = graphs.capture()
    except Exception as exc:  # noqa: BLE001 - serve without graphs rather than not at all
        log.error("capturing CUDA graphs failed (%s: %s); decode steps run the compiled step without them",
                  type(exc).__name__, exc, exc_info=True)
        return None
    log.info("captured %d CUDA graphs of decode steps (batch sizes %d..%d) in %.1f s",
             len(sizes), sizes[0], sizes[-1], seconds)
    return graphs
