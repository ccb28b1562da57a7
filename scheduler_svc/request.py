"""A request as the scheduler core sees it: token ids, progress, blocks, status.

Memory matters: a million of these may wait at once, so __slots__, no per-step data, and no
reference back to the scheduler (no cycles, so refcounting frees them without the cyclic GC).
"""
import enum
import itertools

from protocol.pooling import PoolingParams
from protocol.sampling import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6


FINISHED_STATUS = {
    "stop": RequestStatus.FINISHED_STOPPED,
    "length": RequestStatus.FINISHED_LENGTH,
    "abort": RequestStatus.FINISHED_ABORTED,
    "error": RequestStatus.FINISHED_ERROR,
}
_FINISH_REASON = {status: reason for reason, status in FINISHED_STATUS.items()}
_ARRIVALS = itertools.count()  # one numbering for the process: see Request.arrival


class Request:
    __slots__ = ("request_id", "prompt_token_ids", "params", "priority", "client", "stream",
                 "output_token_ids", "output_logprobs", "num_computed_tokens", "status",
                 "block_ids", "num_blocks_sent", "arrival", "block_hashes",
                 "num_cached_blocks", "num_inflight_tokens", "num_output_placeholders", "prompt_logprobs",
                 "pooling", "pooled")

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 priority: int = 0, client=None, stream: bool = False, pooling: PoolingParams | None = None):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.priority = priority
        self.client = client  # opaque: the service routes outputs with it
        self.stream = stream  # opaque likewise
        self.output_token_ids: list[int] = []
        self.output_logprobs: list | None = [] if params.logprobs is not None else None
        # SamplingParams.prompt_logprobs: entries of prompt tokens 1, 2, ... as chunks score them.
        self.prompt_logprobs: list | None = [] if params.prompt_logprobs is not None else None
        # Tokens whose KV the worker has computed; the next step computes from here.
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING  # a finished status says why (finish_reason)
        # GPU block ids while WAITING/RUNNING, CPU block ids while SWAPPED.
        self.block_ids: list[int] = []
        # How many of block_ids the worker already knows; the plan sends only the rest.
        self.num_blocks_sent = 0
        # Numbered once, as it is made (it arrives): priority ties break by it, in `pending` and in
        # every core, and it is unique, so two requests never tie.
        self.arrival = next(_ARRIVALS)
        # Prefix caching. Chained hashes of the full blocks of its tokens, computed lazily
        # (scheduler_svc.block_hash); None until first needed, so a waiting request costs nothing.
        self.block_hashes: list[bytes] | None = None
        # How many leading blocks of block_ids the block manager has offered to the cache
        # (found there on admission, or registered once their KV was computed).
        self.num_cached_blocks = 0
        # Async scheduling: tokens scheduled in plans whose results have not been applied yet,
        # and how many of those plans will sample a token for it (not yet known).
        self.num_inflight_tokens = 0
        self.num_output_placeholders = 0
        # A pooling request: its whole prompt runs in one step, which ends it with `pooled` (the
        # worker's float32 values) instead of a token.
        self.pooling = pooling
        self.pooled: bytes | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building all_token_ids."""
        prompt = self.prompt_token_ids
        num_prompt = len(prompt)
        if end <= num_prompt:
            return prompt[start:end]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt:end - num_prompt]
        return prompt[start:] + self.output_token_ids[:end - num_prompt]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        """Why it ended ("stop", "length", "abort", "error"), or None while live."""
        return _FINISH_REASON.get(self.status)

    def add_prompt_logprobs(self, first_scored: int, entries: list) -> None:
        """A chunk's entries from prompt index first_scored; those held already (a prompt scored
        again after a recompute preemption) are skipped."""
        have = len(self.prompt_logprobs) + 1  # the next prompt index without an entry
        self.prompt_logprobs.extend(entries[have - first_scored:] if have >= first_scored else [])

    def mark_finished(self, reason: str) -> None:
        """Records why it ended; whoever holds it frees what it holds (Scheduler._finish, or
        the service's _end for a request still in `pending`)."""
        self.status = FINISHED_STATUS[reason]

    def reset_for_recompute(self) -> None:
        """Forget all KV (blocks already freed by the caller); keep the generated tokens."""
        assert not self.block_ids, "free the blocks before resetting"
        self.num_computed_tokens = 0
        self.num_blocks_sent = 0
        self.status = RequestStatus.WAITING

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={len(self.block_ids)})")


class RequestUpdate:
    """What one step did to one request: the tokens it got and, on its last step, why it ended
    (error: (code, message) when the worker failed this request alone)."""

    __slots__ = ("request", "new_token_ids", "new_logprobs", "finish_reason", "error")

    def __init__(self, request: Request, new_token_ids: list[int], new_logprobs: list | None,
                 finish_reason: str | None, error: tuple[str, str] | None = None):
        self.request = request
        self.new_token_ids = new_token_ids
        self.new_logprobs = new_logprobs
        self.finish_reason = finish_reason
        self.error = error

    def __repr__(self) -> str:
        return (f"RequestUpdate({self.request.request_id!r}, {self.new_token_ids}, "
                f"finish_reason={self.finish_reason!r})")
