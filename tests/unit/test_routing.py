"""Prefix routing (scheduler_svc/routing.py) over two real replicas' cores, refilled by their real
step-loop drivers from the real `pending`; the worker is tests/scheduler_fakes.FakeWorker, which
checks every plan, so KV a routed request shares was really computed on its replica."""
import pytest

from protocol.client_messages import GenerateRequest
from protocol.sampling import SamplingParams
from protocol.worker_messages import WorkerHello
from scheduler_svc.admission import Admission
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.live_requests import LiveRequests
from scheduler_svc.replica_set import ReplicaSet
from scheduler_svc.routing import BALANCE_ABS_THRESHOLD
from scheduler_svc.step_loop import ReplicaDriver
from tests.scheduler_fakes import FakeWorker

BLOCK_SIZE = 4
NUM_BLOCKS = 64
MAX_NUM_SEQS = 4  # a driver's watermark: 8 requests waiting in its core
PREFIX = list(range(500, 532))  # 8 full blocks
PARAMS = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


class Cluster:
    """Two replicas, "a" and "b", as the service holds them."""

    def __init__(self, routing="prefix", policy="fcfs"):
        self.config = SchedulerConfig(max_num_seqs=MAX_NUM_SEQS, routing=routing, policy=policy)
        self.replicas = ReplicaSet(self.config)
        self.requests = LiveRequests(self.config, Admission(), self.replicas, None)
        self.drivers, self.workers = {}, {}
        for name in ("a", "b"):
            hello = WorkerHello(worker_id=name, model="tiny-llama", device="cpu", dtype="float32", vocab_size=32000,
                                max_model_len=256, block_size=BLOCK_SIZE, num_gpu_blocks=NUM_BLOCKS,
                                num_cpu_blocks=0, num_state_slots=0, eos_token_ids=[2], tokenizer_json=None)
            replica = self.replicas.join(name.encode(), hello)
            self.drivers[name] = ReplicaDriver(replica, self.replicas, self.config, self.requests, send_plan=None,
                                               flush_outputs=None, drop_replica=None, metrics=None,
                                               check_integrity_when_idle=False)
            self.workers[name] = FakeWorker(BLOCK_SIZE)
        self.num_admitted = 0

    def replica(self, name):
        return self.drivers[name].replica

    def admit(self, *prompts, priority=0) -> list[str]:
        ids = []
        for prompt in prompts:
            ids.append(f"r{self.num_admitted}")
            self.num_admitted += 1
            self.requests.admit(b"client", [GenerateRequest(ids[-1], list(prompt), PARAMS, priority)])
        return ids

    def refill(self, name):
        self.drivers[name].refill()

    def run(self, name):
        """The replica's steps until its core holds nothing (its finished blocks stay cached)."""
        core, worker = self.replica(name).core, self.workers[name]
        while (plan := core.schedule()) is not None:
            core.update(plan, worker.run(plan))
        core.check_integrity()

    def holds(self, name, request_id) -> bool:
        return self.replica(name).core.get_request(request_id) is not None

    def cache(self, name, prompt):
        """The prompt computed on that replica alone, wherever its prefix is cached."""
        self.admit(prompt)
        self.replica(name).core.add_request(self.requests.pending.pop())
        self.run(name)


def suffix(i: int) -> list[int]:
    return [600 + i, 700 + i, 800 + i]


def test_a_prompt_goes_to_the_replica_caching_its_prefix():
    cluster = Cluster()
    cluster.cache("a", PREFIX + suffix(0))
    [request_id] = cluster.admit(PREFIX + suffix(1))
    cluster.refill("b")  # b has room and asks first
    assert not cluster.holds("b", request_id) and cluster.requests.num_waiting == 1
    assert cluster.replica("a").wakeup.is_set()
    cluster.refill("a")
    assert cluster.holds("a", request_id) and cluster.requests.num_waiting == 0
    cluster.run("a")
    a = cluster.replica("a")
    assert a.num_routed_by_prefix == 1
    assert a.core.block_manager.num_prefix_cache_hits == len(PREFIX)


def test_load_routing_gives_the_request_to_whoever_asks():
    cluster = Cluster(routing="load")
    cluster.cache("a", PREFIX + suffix(0))
    [request_id] = cluster.admit(PREFIX + suffix(1))
    cluster.refill("b")
    assert cluster.holds("b", request_id)
    assert cluster.replica("a").num_routed_by_prefix == 0


def test_a_prefix_cached_on_both_stays_with_the_replica_asking():
    cluster = Cluster()
    cluster.cache("a", PREFIX + suffix(0))
    cluster.cache("b", PREFIX + suffix(1))
    ids = cluster.admit(PREFIX + suffix(2), PREFIX + suffix(3))
    cluster.refill("b")
    assert all(cluster.holds("b", i) for i in ids)


def test_a_burst_sharing_an_uncached_prefix_follows_its_first_request():
    """Before any replica has computed the prefix, the one that took its first request will: the
    next request needing it goes there too, so the prefix is computed once."""
    cluster = Cluster()
    [first] = cluster.admit(PREFIX + suffix(0))
    cluster.refill("a")
    [second] = cluster.admit(PREFIX + suffix(1))
    [other] = cluster.admit(list(range(900, 932)) + suffix(2))  # a prefix no one is computing
    cluster.refill("b")
    assert cluster.holds("a", first) and cluster.holds("b", other)
    assert not cluster.holds("b", second) and cluster.replica("a").num_routed_by_prefix == 1
    cluster.refill("a")
    assert cluster.holds("a", second)
    cluster.run("a")


def test_a_burst_of_new_prefixes_spreads_over_the_replicas_each_prefix_on_one():
    """Prefixes no replica caches or computes go to the least loaded replica, not all to the one
    that refills first; each prefix's later prompts follow its first."""
    cluster = Cluster()
    other = list(range(900, 932))
    ids = cluster.admit(PREFIX + suffix(0), other + suffix(1), PREFIX + suffix(2), other + suffix(3))
    cluster.refill("a")
    assert cluster.holds("a", ids[0]) and cluster.holds("a", ids[2])
    assert not cluster.holds("a", ids[1]) and not cluster.holds("a", ids[3])
    assert cluster.replica("b").wakeup.is_set()
    cluster.refill("b")
    assert cluster.holds("b", ids[1]) and cluster.holds("b", ids[3])
    for name in ("a", "b"):
        cluster.run(name)
    assert cluster.requests.num_waiting == 0


def test_a_dropped_replica_computing_a_prefix_no_longer_attracts_it():
    cluster = Cluster()
    cluster.admit(PREFIX + suffix(0))
    cluster.refill("a")
    a = cluster.replica("a")
    cluster.replicas.remove(a)
    a.fail()
    cluster.requests.requeue(a)
    [later] = cluster.admit(PREFIX + suffix(1))
    cluster.refill("b")
    assert cluster.holds("b", later)


def test_load_past_the_threshold_overrides_the_cache():
    cluster = Cluster()
    cluster.cache("a", PREFIX + suffix(0))
    ids = cluster.admit(*(PREFIX + suffix(i) for i in range(1, 101)))
    cluster.refill("b")
    router = cluster.requests.router
    a, b = cluster.replica("a"), cluster.replica("b")
    on_b = [i for i in ids if cluster.holds("b", i)]
    # b computes the prefix itself once a holds the threshold's worth more than b, and fills its core.
    assert len(on_b) == b.core.num_waiting == 2 * MAX_NUM_SEQS
    assert BALANCE_ABS_THRESHOLD <= router.load(a) - router.load(b) <= BALANCE_ABS_THRESHOLD + 1
    assert cluster.requests.num_waiting == 100 - len(on_b)
    cluster.run("b")
    assert b.core.block_manager.num_prefix_cache_hits > 0  # its first request cached the prefix there


def test_evicted_blocks_stop_attracting_prompts():
    cluster = Cluster()
    cluster.cache("a", PREFIX + suffix(0))
    for i in range(8):  # 8 x 9 distinct blocks: more than the pool, so the prefix's blocks are evicted
        cluster.cache("a", [1000 + 40 * i + t for t in range(36)])
    assert cluster.replica("a").core.block_manager.find_cached_prefix(
        cluster.requests.book.get(cluster.admit(PREFIX + suffix(1))[0])).block_ids == []
    cluster.refill("b")
    assert cluster.replica("b").core.num_waiting == 1 and cluster.replica("a").num_routed_by_prefix == 0


def test_a_dropped_replica_is_forgotten_and_what_was_routed_to_it_runs_elsewhere():
    cluster = Cluster()
    cluster.cache("a", PREFIX + suffix(0))
    [request_id] = cluster.admit(PREFIX + suffix(1))
    cluster.refill("b")
    a = cluster.replica("a")
    assert not cluster.holds("b", request_id)
    cluster.replicas.remove(a)  # as the service drops a replica
    a.fail()
    assert cluster.requests.requeue(a) == 1
    assert len(cluster.requests.router) == 0 and len(cluster.requests.pending) == 1
    cluster.refill("b")
    assert cluster.holds("b", request_id)
    cluster.run("b")
    assert cluster.replica("b").core.block_manager.num_prefix_cache_hits == 0


def test_a_request_aborted_while_routed_is_skipped():
    cluster = Cluster()
    cluster.cache("a", PREFIX + suffix(0))
    doomed, kept = cluster.admit(PREFIX + suffix(1), PREFIX + suffix(2))
    cluster.refill("b")
    assert cluster.requests.num_waiting == 2
    cluster.requests.abort(doomed, b"client")
    assert cluster.requests.num_waiting == 1
    cluster.refill("a")
    assert not cluster.holds("a", doomed) and cluster.holds("a", kept)
    assert cluster.requests.num_waiting == 0


def test_the_replica_takes_its_routed_and_the_pending_requests_in_priority_order():
    cluster = Cluster(policy="priority")
    cluster.cache("a", PREFIX + suffix(0))
    [batch] = cluster.admit(PREFIX + suffix(1), priority=10)
    cluster.refill("b")  # routed to a
    [urgent] = cluster.admit([5, 6, 7], priority=0)  # cached nowhere: a takes it when it asks
    router, pending = cluster.requests.router, cluster.requests.pending
    request, queue = router.next_for(cluster.replica("a"), pending)
    assert request.request_id == urgent and queue is pending
    cluster.refill("a")
    assert cluster.holds("a", urgent) and cluster.holds("a", batch)


@pytest.mark.parametrize("num_pending", [1_000, 20_000])
def test_a_refill_touches_a_bounded_number_of_requests_however_many_wait(num_pending):
    """Routing away does not fill the refilling core, so it must stop by itself: at the balance
    threshold. Only the requests it looked at are hashed; the rest of `pending` is untouched."""
    cluster = Cluster()
    cluster.cache("a", PREFIX + suffix(0))
    cluster.admit(*(PREFIX + suffix(i) for i in range(1, num_pending + 1)))
    cluster.refill("b")
    looked_at = cluster.num_admitted - 1 - len(cluster.requests.pending)
    bound = BALANCE_ABS_THRESHOLD + 1 + 2 * 2 * MAX_NUM_SEQS
    assert 2 * MAX_NUM_SEQS < looked_at <= bound
    hashed = sum(cluster.requests.book.get(f"r{i}").block_hashes is not None for i in range(1, num_pending + 1))
    assert hashed == looked_at
