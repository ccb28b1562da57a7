"""ReplicaSet: the replicas that joined this scheduler, the one record of membership.

A replica is found by its group name, by one of its workers' ids (heartbeats) or by one of its
ranks' connection identities (step results, closed connections). Each Replica holds its own
ranks, so the lookups ask the replicas instead of keeping mirrors of them in step by hand: a scan
over the few replicas, never over requests. The model a replica serves is in its hello.

It also remembers the replicas dropped because their workers fell silent (stalled: a stopped
process, a hung step, swap) while their connections stay open: they are the unhealthy replicas
of /health and /metrics until their workers say hello again (such a worker rejoins by itself,
worker_svc/service.py) or their connections close (the process is gone).
"""
from typing import Iterator

from protocol.worker_messages import WorkerHello
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.replica import Replica


class ReplicaSet:
    def __init__(self, config: SchedulerConfig):
        self._config = config
        self._by_name: dict[str, Replica] = {}
        self._stalled: dict[str, frozenset[bytes]] = {}  # name -> its ranks' connection identities

    def __len__(self) -> int:
        return len(self._by_name)

    def __iter__(self) -> Iterator[Replica]:
        return iter(self._by_name.values())

    def __contains__(self, replica: Replica) -> bool:
        return self._by_name.get(replica.name) is replica

    def by_worker_id(self, worker_id: str) -> Replica | None:
        return next((r for r in self._by_name.values() if worker_id in r.worker_ids.values()), None)

    def by_identity(self, identity: bytes) -> Replica | None:
        return next((r for r in self._by_name.values() if identity in r.identities.values()), None)

    def hello(self) -> WorkerHello | None:
        """A joined worker's hello (every replica serves the same model); None when none is joined."""
        return next((r.hello for r in self._by_name.values()), None)

    def join(self, identity: bytes, hello: WorkerHello) -> Replica:
        """The worker's rank joins its replica (new for its first rank). A worker that joined
        before must have been removed first (it restarted: its old state is gone)."""
        name = hello.group_id or hello.worker_id
        self._stalled.pop(name, None)
        replica = self._by_name.get(name)
        if replica is None:
            replica = self._by_name[name] = Replica(name, hello, self._config)
        replica.add_rank(hello.rank, identity, hello.worker_id)
        return replica

    def remove(self, replica: Replica) -> bool:
        """False when it is no longer a member (dropped already)."""
        if replica not in self:
            return False
        del self._by_name[replica.name]
        return True

    def mark_stalled(self, replica: Replica) -> None:
        """The replica, removed for silence, is unhealthy until it rejoins or its connections close."""
        self._stalled[replica.name] = frozenset(replica.identities.values())

    def connection_closed(self, identity: bytes) -> None:
        """A stalled replica whose connection closed is gone, not unhealthy."""
        name = next((n for n, identities in self._stalled.items() if identity in identities), None)
        if name is not None:
            del self._stalled[name]

    @property
    def stalled_names(self) -> list[str]:
        return sorted(self._stalled)
