"""Answers to model-info and health queries, from the replicas' cores and workers' heartbeats."""

from protocol.client_messages import Health, ModelInfo, ReplicaHealth
from protocol.worker_messages import WorkerHello
from scheduler_svc.replica import Replica


def model_info(hello: WorkerHello | None, num_replicas: int, max_queued_requests: int = 0,
               instance_id: str = "") -> ModelInfo:
    if hello is None:
        return ModelInfo(model=None, max_queued_requests=max_queued_requests, instance_id=instance_id)
    return ModelInfo(model=hello.model, vocab_size=hello.vocab_size, max_model_len=hello.max_model_len,
                     eos_token_ids=hello.eos_token_ids, tokenizer_json=hello.tokenizer_json,
                     num_replicas=num_replicas, chat_template=hello.chat_template,
                     special_tokens=hello.special_tokens, max_queued_requests=max_queued_requests,
                     instance_id=instance_id, dtype=hello.dtype, device=hello.device, compiled=hello.compiled,
                     sampling_defaults=hello.sampling_defaults, pooling=hello.pooling)


def health(replicas: list[Replica], num_pending: int, num_finished: int) -> Health:
    cores = [r.core for r in replicas]
    timings = [r.step_timing() for r in replicas]  # (mean step ms, worker busy fraction) each
    block_managers = [c.block_manager for c in cores]
    # Rank 0 speaks for its group: every rank holds the same requests.
    beats = [r.last_heartbeat[r.worker_ids[0]] for r in replicas if r.worker_ids.get(0) in r.last_heartbeat]
    return Health(
        num_waiting=num_pending + sum(c.num_waiting for c in cores),
        num_running=sum(c.num_running for c in cores),
        num_swapped=sum(c.num_swapped for c in cores),
        num_workers=sum(len(r.identities) for r in replicas),
        num_free_blocks=sum(c.num_free_blocks for c in cores),
        num_total_blocks=sum(c.num_total_blocks for c in cores),
        num_free_state_slots=sum(c.num_free_state_slots for c in cores),
        num_total_state_slots=sum(r.hello.num_state_slots for r in replicas),
        steps_per_s=round(sum(1000 / mean_ms for mean_ms, _ in timings if mean_ms), 2),
        num_steps=sum(r.num_steps for r in replicas),
        num_finished=num_finished,
        worker_kv_blocks_in_use=sum(b.num_kv_blocks_in_use for b in beats),
        worker_state_slots_in_use=sum(b.num_state_slots_in_use for b in beats),
        replicas=[ReplicaHealth(r.name, len(r.identities), r.num_steps, r.core.num_waiting, r.core.num_running,
                                r.core.num_swapped, r.core.num_free_blocks, r.core.num_total_blocks,
                                *(round(x, 3) for x in timing), r.core.block_manager.num_prefix_cache_queries,
                                r.core.block_manager.num_prefix_cache_hits, r.num_routed_by_prefix)
                  for r, timing in zip(replicas, timings)],
        num_preemptions=sum(c.num_preemptions for c in cores),
        num_cached_blocks=sum(b.num_cached_blocks for b in block_managers),
        num_prefix_cache_queries=sum(b.num_prefix_cache_queries for b in block_managers),
        num_prefix_cache_hits=sum(b.num_prefix_cache_hits for b in block_managers),
    )
