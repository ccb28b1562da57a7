"""StateSlotPool: a fixed pool of Mamba state slots, request id -> slot.

A slot is taken when a request first reaches the worker (or comes back after a recompute
preemption) and is given back only when its id arrives in a plan's finished_ids or
preempted_ids. The caller zeroes the slot's conv and SSM rows when it is taken, so a reused
slot never leaks a previous request's state.
"""


class StateSlotPool:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._slot_of: dict[str, int] = {}

    def allocate(self, request_id: str) -> int:
        """Slot for a request that has none; raises if the scheduler over-committed."""
        assert request_id not in self._slot_of, f"{request_id} already holds a state slot"
        if not self._free:
            raise RuntimeError(f"no free state slot for {request_id} ({self.num_slots} in use)")
        slot = self._free.pop()
        self._slot_of[request_id] = slot
        return slot

    def free(self, request_id: str) -> int | None:
        slot = self._slot_of.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)
        return slot

    @property
    def num_in_use(self) -> int:
        return len(self._slot_of)

    def check_integrity(self) -> None:
        in_use = set(self._slot_of.values())
        assert len(in_use) == len(self._slot_of), "a state slot is owned twice"
        assert not in_use & set(self._free), "a state slot is both free and in use"
        assert len(in_use) + len(self._free) == self.num_slots, "state slots leaked"
