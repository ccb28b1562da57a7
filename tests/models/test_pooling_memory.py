"""A pooling worker's host memory stays flat over the requests it serves: steps of varied token
counts (embedding prompts of varied lengths) allocate activations of a new size each step, which
glibc's default, dynamic mmap threshold left fragmenting the heap (worker_svc/malloc_policy.py)."""
import numpy as np

from protocol.pooling import PoolingParams
from protocol.sampling import SamplingParams
from protocol.worker_messages import NewRequestData, StepPlan
from tests.hf_model_folders import make_bert_folder
from worker_svc.runner import ModelRunner
from worker_svc.runner_config import RunnerConfig

BATCH = 16


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def _serve(runner: ModelRunner, rng: np.random.Generator, first_step: int, num_steps: int) -> None:
    """num_steps plans of BATCH pooling requests of 3-99 tokens, each finished by the next plan."""
    finished = []
    for step in range(first_step, first_step + num_steps):
        lens = rng.integers(3, 100, BATCH)
        news = [NewRequestData(f"r{step}-{i}", rng.integers(4, 900, n).tolist(), int(n), SamplingParams(max_tokens=1),
                               [], 0, int(n), PoolingParams()) for i, n in enumerate(lens)]
        result = runner.execute(StepPlan(step_id=step, finished_ids=finished, preempted_ids=[], new_requests=news,
                                         running_requests=[]))
        assert result.error is None, result.error
        assert len(result.pooled) == BATCH
        finished = [new.request_id for new in news]
    runner.execute(StepPlan(step_id=-1, finished_ids=finished, preempted_ids=[], new_requests=[], running_requests=[]))
    assert runner.requests.num_requests == 0 and not runner.requests.pooling


def test_rss_flat_over_requests_of_varied_lengths(tmp_path):
    runner = ModelRunner(RunnerConfig(model=make_bert_folder(tmp_path / "bert"), dtype="float32",
                                      enforce_eager=True, threads=1))
    rng = np.random.default_rng(0)
    _serve(runner, rng, 0, 50)  # warm-up: the first sizes, the allocator's own tables
    before = _rss_mib()
    _serve(runner, rng, 50, 300)  # 4,800 requests: about 70 MiB more with the dynamic threshold
    grown = _rss_mib() - before
    assert grown < 20, f"RSS grew {grown:.1f} MiB over 4,800 pooling requests"
