"""The scheduler's integrity check: every block owned once or free, every request in one queue."""
from scheduler_svc.request import Request, RequestStatus


def check_integrity(scheduler, waiting: list[Request], running: list[Request],
                    swapped: list[Request], requests: dict[str, Request]) -> None:
    seen: set[int] = set()
    for queue, status in ((waiting, RequestStatus.WAITING), (running, RequestStatus.RUNNING),
                          (swapped, RequestStatus.SWAPPED)):
        for request in queue:
            assert id(request) not in seen, f"{request} is in two queues"
            seen.add(id(request))
            assert request.status == status, f"{request} in the {status.name} queue"
            assert requests.get(request.request_id) is request, f"{request} missing from the map"
            assert request.num_blocks_sent <= len(request.block_ids) or status == RequestStatus.WAITING
    assert len(seen) == len(requests), "a live request is in no queue"
    assert len(waiting) == scheduler.num_waiting, "waiting count drifted"
    for request in waiting:
        assert not request.block_ids and request.num_computed_tokens == 0 and request.num_cached_blocks == 0, \
            f"{request} waits holding KV"
    block_size = scheduler.capacity.block_size
    for request in running:
        assert request.num_computed_tokens <= len(request.block_ids) * block_size, f"{request} lacks blocks"
    assert len(running) <= scheduler.max_num_running, "too many running"
    if not scheduler.has_plan_in_flight:
        for request in requests.values():
            assert request.num_inflight_tokens == 0 and request.num_output_placeholders == 0, \
                f"{request} awaits a step that is not in flight"
    scheduler.block_manager.check_integrity(running, swapped, scheduler.has_plan_in_flight)
