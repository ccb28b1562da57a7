"""What a CUDA graph of a decode step records (worker_svc/cuda_graphs.py), run on CPU: the
forward over the static buffers, with each step copied in as a replay would, gives the same
greedy tokens as the runner's own step, while batches grow past the largest graph (those steps
run without one), shrink, and hand finished requests' blocks to others (stale rows of a larger
step must not write into them). Only graph.replay() itself is CUDA's and is not run here."""
import torch

from protocol.sampling import SamplingParams
from tests.plan_player import PlanPlayer
from worker_svc.cuda_graphs import DecodeGraphs, StaticDecodeInputs, capture_sizes
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig

NUM_REQUESTS, LARGEST_GRAPH = 20, 16


class ForwardOverBuffers(DecodeGraphs):
    """Runs what the graph of a size would replay: the forward over the buffers."""

    def _replay(self, size: int) -> torch.Tensor:
        return self.forward_static(size)


def _greedy(runner: ModelRunner) -> dict[str, list[int]]:
    player = PlanPlayer(runner, token_budget=48)  # prefills chunked, mixed with decodes
    generator = torch.Generator().manual_seed(3)
    for i in range(NUM_REQUESTS):
        prompt = torch.randint(4, runner.vocab_size, (3 + 2 * i,), generator=generator).tolist()
        num_new = 2 + (7 * i) % 15  # requests end at different steps: batches shrink, blocks move
        player.add(f"req-{i}", prompt, SamplingParams(temperature=0.0, max_tokens=num_new, min_tokens=num_new))
    return player.run()


def _runner() -> ModelRunner:
    return ModelRunner(RunnerConfig(model="micro-llama", dtype="float32", block_size=4, num_gpu_blocks=400,
                                    enforce_eager=True))


def test_forward_over_graph_buffers_equals_the_step():
    expected = _greedy(_runner())
    runner = _runner()
    inputs = StaticDecodeInputs(LARGEST_GRAPH, runner.requests.max_blocks, runner.scratch_slot,
                                runner.block_size, runner.device)
    graphs = ForwardOverBuffers(runner.executor.compiled_forward, runner.caches, inputs,
                                capture_sizes(LARGEST_GRAPH))
    runner.executor.decode_graphs = graphs
    assert _greedy(runner) == expected
    assert graphs.num_replays >= 10  # the decode steps of 16 requests or fewer
