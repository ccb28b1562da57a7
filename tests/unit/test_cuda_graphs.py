"""CUDA graphs of decode steps (worker_svc/cuda_graphs.py), the parts that run on CPU: which
graph a step takes, the copy of a step into the static buffers, and that a CPU worker never
captures. The forward over those buffers is tests/models/test_decode_graph_inputs.py."""
import numpy as np
import torch

from worker_svc.attention import build_attention_metadata
from worker_svc.cuda_graphs import DecodeGraphs, StaticDecodeInputs, capture_decode_graphs, capture_sizes

BLOCK_SIZE, NUM_BLOCKS, MAX_BLOCKS = 4, 10, 5
SCRATCH_SLOT = NUM_BLOCKS * BLOCK_SIZE  # the runner's: the block past the scheduler's


def test_capture_sizes_are_the_padded_buckets():
    assert capture_sizes(0) == []
    assert capture_sizes(20) == [8, 16]
    sizes = capture_sizes(512)
    assert sizes[0] == 8 and sizes[-1] == 512 and len(sizes) == 64


def test_a_step_takes_the_smallest_graph_that_holds_it():
    graphs = DecodeGraphs(None, None, None, capture_sizes(64))
    assert [graphs.size_for(n) for n in (1, 8, 9, 16, 63, 64, 65)] == [8, 8, 16, 16, 64, 64, None]


def test_cpu_and_size_zero_never_capture():
    cpu = torch.device("cpu")
    assert capture_decode_graphs(None, None, cpu, 512, 64, BLOCK_SIZE, SCRATCH_SLOT) is None
    assert capture_decode_graphs(None, None, torch.device("cuda"), 0, 64, BLOCK_SIZE, SCRATCH_SLOT) is None


def _decodes(num: int, num_padded: int, seed: int):
    """input ids, positions, metadata of `num` decodes on a token axis of num_padded."""
    rng = np.random.default_rng(seed)
    num_computed = rng.integers(1, MAX_BLOCKS * BLOCK_SIZE - 1, num)
    tables = rng.integers(0, NUM_BLOCKS, (num, MAX_BLOCKS))
    positions = np.zeros(num_padded, dtype=np.int64)
    positions[:num] = num_computed
    slots = np.full(num_padded, SCRATCH_SLOT)
    slots[:num] = tables[np.arange(num), num_computed // BLOCK_SIZE] * BLOCK_SIZE + num_computed % BLOCK_SIZE
    ids = np.zeros(num_padded, dtype=np.int64)
    ids[:num] = rng.integers(4, 100, num)
    meta = build_attention_metadata(np.ones(num, dtype=np.int64), num_computed, tables, slots, BLOCK_SIZE,
                                    torch.device("cpu"))
    return torch.from_numpy(ids), torch.from_numpy(positions), meta


def test_fill_copies_the_step_and_pads_the_rest_of_the_graph():
    inputs = StaticDecodeInputs(16, MAX_BLOCKS, SCRATCH_SLOT, BLOCK_SIZE, torch.device("cpu"))
    ids, positions, big = _decodes(13, 16, seed=0)  # a larger step first: rows 3..16 hold its values
    inputs.fill(16, ids, positions, big)
    ids, positions, small = _decodes(3, 8, seed=1)
    inputs.fill(16, ids, positions, small)
    assert torch.equal(inputs.input_ids[:8], ids) and torch.equal(inputs.positions[:8], positions)
    assert torch.equal(inputs.slot_mapping[:3], small.slot_mapping[:3])
    width = small.decode_block_tables.shape[1]
    assert torch.equal(inputs.block_tables[:3, :width], small.decode_block_tables)
    assert torch.equal(inputs.context_lens[:3], small.decode_context_lens)
    # Past the step, every row of the graph is padding: its K/V to the scratch slot (never into
    # the blocks the larger step's requests, or their successors, own), one scratch key to read.
    assert (inputs.slot_mapping[3:] == SCRATCH_SLOT).all()
    assert (inputs.context_lens[3:] == 1).all()
    assert (inputs.block_tables[3:, 0] == NUM_BLOCKS).all()
    meta = inputs.metadata(16)
    assert meta.num_tokens == meta.num_decode_tokens == 16 and meta.prefill is None
    assert meta.slot_mapping.data_ptr() == inputs.slot_mapping.data_ptr()  # views: what a graph reads


def test_only_decode_steps_fit():
    inputs = StaticDecodeInputs(16, MAX_BLOCKS, SCRATCH_SLOT, BLOCK_SIZE, torch.device("cpu"))
    assert inputs.fits(_decodes(5, 8, seed=2)[2])
    mixed = build_attention_metadata(np.array([1, 3]), np.array([4, 0]), np.zeros((2, MAX_BLOCKS), dtype=np.int64),
                                     np.zeros(8, dtype=np.int64), BLOCK_SIZE, torch.device("cpu"))
    assert not inputs.fits(mixed)
