"""LiveRequests: how a request starts and ends on the scheduler, from every path.

A request admitted from a client's Generate waits in `pending` until a replica's step loop moves
it into its core (step_loop.py), or into the queue of the replica `router` sends it to
(routing.py), which moves it into its core in turn; `book` indexes every live one by id and client
(request_book.py). `end` is the one way a live request ends here: a step's stop, length or
error, an abort, a refusal, a vanished client, the drain. Each ending's last output goes into
`outputs`, which the service flushes to the clients.
"""
from protocol import ErrorCode
from protocol.client_messages import GenerateRequest
from scheduler_svc.admission import Admission
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.gc_tuning import tune_gc_for_large_queues
from scheduler_svc.metrics import SchedulerMetrics
from scheduler_svc.outputs import OutputBatcher, error_output, output_for
from scheduler_svc.replica import Replica
from scheduler_svc.replica_set import ReplicaSet
from scheduler_svc.request import Request
from scheduler_svc.request_book import RequestBook
from scheduler_svc.routing import Router
from scheduler_svc.waiting_queue import make_waiting_queue


class LiveRequests:
    def __init__(self, config: SchedulerConfig, admission: Admission, replicas: ReplicaSet,
                 metrics: SchedulerMetrics | None):
        self.pending = make_waiting_queue(config.policy)
        self.router = Router(config)
        self.book = RequestBook()  # every live request, by id and client
        self.outputs = OutputBatcher()
        self._admission = admission
        self._replicas = replicas
        self._metrics = metrics

    def admit(self, client: bytes, requests: list[GenerateRequest]) -> None:
        """Each request into `pending`, or refused alone (admission.py)."""
        book = self.book
        for g in requests:
            refusal = self._admission.refusal(g, len(book), book.__contains__)
            if refusal is not None:
                self.outputs.add(client, error_output(g.request_id, len(g.prompt_token_ids), *refusal))
                continue
            request = Request(g.request_id, g.prompt_token_ids, g.params, g.priority, client=client, stream=g.stream,
                              pooling=g.pooling)
            book.add(request)
            self.pending.push(request)
            if self._metrics is not None:
                self._metrics.on_arrival(request.request_id)
        tune_gc_for_large_queues()  # keep the new requests out of the cyclic GC's scans

    def refuse_invalid(self, client: bytes, invalid: list[tuple[str, str]]) -> None:
        """Requests that failed validation: (request id, why) each, failed alone."""
        for request_id, error in invalid:
            self.outputs.add(client, error_output(request_id, 0, ErrorCode.INVALID_PARAMS, error))

    def end(self, request: Request, reason: str, error: tuple[str, str] | None = None,
            new_token_ids: list[int] | None = None, new_logprobs: list | None = None) -> None:
        """The one way a live request ends: out of whichever queue holds it (its core frees its
        blocks and queues its id for the worker; `pending` skips it lazily), out of the book,
        counted, and its last output to its client.
        error: (code, message) for reason "error"; new_*: what its last step gave it."""
        if not request.is_finished:  # else its core ended it in a step, and said so in an update
            replica = self._replica_holding(request)
            if replica is not None:
                replica.core.abort(request.request_id, reason)
                replica.wakeup.set()  # its id must reach the worker in a (possibly free-only) plan
            else:
                request.mark_finished(reason)  # still waiting: skipped when it reaches the front
                if not self.router.remove(request):
                    self.pending.mark_removed()
        self.book.forget(request)
        if self._metrics is not None:
            self._metrics.on_end(request, reason)
        if reason == "error":
            assert error is not None, "an error ends a request with its code and message"
            output = error_output(request.request_id, request.num_prompt_tokens, *error)
        else:
            output = output_for(request, new_token_ids or [], new_logprobs, reason)
        if output is not None:
            self.outputs.add(request.client, output)

    def _replica_holding(self, request: Request) -> Replica | None:
        """The replica whose core holds the request; None while it waits in `pending` or routed.
        O(replicas): each core is the one owner of what it holds."""
        for replica in self._replicas:
            if replica.core.get_request(request.request_id) is request:
                return replica
        return None

    def abort(self, request_id: str, client: bytes | None) -> None:
        """A client's abort (or its vanishing): idempotent, and only of its own requests."""
        request = self.book.get(request_id)
        if request is None or (client is not None and request.client != client):
            return  # unknown, finished, or another client's id
        self.end(request, "abort")

    def fail_all(self, code: str, message: str) -> None:
        """Every live request ends with this error (the drain's end)."""
        for request_id in self.book.ids():
            self.end(self.book.get(request_id), "error", (code, message))

    def client_gone(self, client: bytes) -> None:
        for request_id in self.book.ids_of(client):
            self.abort(request_id, None)
        self.outputs.drop(client)  # nobody to read them; other clients' outputs stay

    @property
    def num_waiting(self) -> int:
        """Requests no core holds yet: in `pending` or routed to a replica."""
        return len(self.pending) + len(self.router)

    def requeue(self, replica: Replica) -> int:
        """A dropped replica's requests, to recompute elsewhere: those its core held, then those
        routed to it, back to the front of `pending`, in the order they ran. Returns how many."""
        requests = replica.core.take_unfinished() + self.router.forget(replica)
        for request in reversed(requests):
            self.pending.push_front(request)
        return len(requests)
