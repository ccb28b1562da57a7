"""BatchRunner: runs the lines of an OpenAI batch file through the scheduler and hands each
outcome, as an output line, to a writer as soon as it is known. The one engine of
`stepserve run-batch` and of the gateway's Batch API (/v1/batches).

Lines are read one at a time and at most `window` requests are in flight, in one stream of the
SDK's (generate_iter_items: generation lines and the pooling lines of one request per prompt,
/v1/embeddings and /v1/classify; /v1/score and /v1/rerank lines are calls of their own:
batch_pooling), so memory holds the window, never the file; the ids it must remember live in
SQLite (batch_ids). A line already in the output (a resumed job) is skipped; a bad
line becomes an error line and the job goes on. Batch requests run at `min_priority` or
lower (vLLM's convention: a larger value is served later), so interactive requests
(priority 0) go first under the scheduler's priority policy.
"""
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec

from client_sdk.batch import DEFAULT_BATCH_WINDOW
from client_sdk.errors import request_failure
from client_sdk.outputs import RequestOutput
from gateway_svc.batch_ids import BatchIds
from gateway_svc.batch_lines import (ENDPOINTS, LineError, custom_id_of, done_key, line_error_output,
                                     refused_output, request_of, response_output)
from gateway_svc.batch_pooling import PoolingLines
from gateway_svc.choices import GatheredChoice
from gateway_svc.errors import APIError, from_sdk_error
from gateway_svc.ids import new_id
from gateway_svc.responses import Formatter, Job, PoolingJob
from gateway_svc.upstream import Upstream
from protocol.client_messages import BATCH_PRIORITY

_encoder = msgspec.json.Encoder()


@dataclass
class BatchCounts:
    num_lines: int = 0  # non-blank input lines read
    num_completed: int = 0  # output lines with a response of status 200
    num_failed: int = 0  # error lines
    num_skipped: int = 0  # already in the output (a resumed job)
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def num_done(self) -> int:
        return self.num_completed + self.num_failed


@dataclass(slots=True)
class _LineInFlight:
    custom_id: str
    job: Job | PoolingJob
    formatter: Formatter | None  # None for a PoolingJob (its own body)
    outputs: list[RequestOutput | None]
    num_open: int


class BatchRunner:
    def __init__(self, upstream: Upstream, write: Callable[[dict], None], *, window: int = DEFAULT_BATCH_WINDOW,
                 min_priority: int = BATCH_PRIORITY, endpoint: str | None = None,
                 on_line: Callable[[BatchCounts, bool], None] = lambda counts, ok: None):
        """write: takes each output line (a dict), in the order they finish. endpoint: the url
        every line must have (batch_lines.request_of). on_line: called after each, with the
        counts so far and whether it was answered (progress, metrics)."""
        self.upstream = upstream
        self.counts = BatchCounts()
        self._write = write
        self._window = window
        self._min_priority = min_priority
        self._endpoint = endpoint
        self._on_line = on_line
        self._ids = BatchIds()
        self._items: dict[int, tuple[_LineInFlight, int]] = {}  # the SDK's item index -> its line, prompt
        self._num_items = 0
        self._pooling = PoolingLines(window, self._pooling_answered, self._pooling_refused)

    def mark_done(self, output: dict) -> None:
        """An output line from before (a resumed job): its line is not run again."""
        self._ids.add_done(*done_key(output))

    async def run(self, lines: Iterable[bytes]) -> BatchCounts:
        """Runs every line not already done; returns the counts. Cancelling it aborts what is
        in flight (those lines get no output line)."""
        outputs = self.upstream.client.generate_iter_items(self._requests(lines), window=self._window)
        try:
            # aclosing: a write that fails (a full disk) aborts what is in flight at once
            async with contextlib.aclosing(outputs):
                async for index, output in outputs:
                    line, i = self._items.pop(index)
                    line.outputs[i] = output
                    line.num_open -= 1
                    if line.num_open == 0:
                        self._finish(line)
            await self._pooling.wait()
        finally:
            await self._pooling.cancel()
            self._ids.close()
        return self.counts

    async def _requests(self, lines: Iterable[bytes]):
        """(prompt, params, priority) for each prompt of each line still to run (token ids to
        generate from; a text or token ids to pool); writes the error line of each bad line as
        it is read."""
        for line_no, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue  # blank lines are not requests (a trailing newline, say)
            self.counts.num_lines += 1
            line = await self._read(raw, line_no)
            if line is None:
                continue
            for i, (prompt, params) in enumerate(zip(line.job.prompts, line.job.params)):
                self._items[self._num_items] = (line, i)
                self._num_items += 1
                yield prompt, params, max(line.job.priority, self._min_priority)

    async def _read(self, raw: bytes, line_no: int) -> _LineInFlight | None:
        """The line as requests to stream, or None: done before, bad (its error line written)
        or a pooling line of its own call (started: batch_pooling)."""
        custom_id = None
        try:
            obj, custom_id = custom_id_of(raw, line_no)
            if not self._ids.first_sight(custom_id):
                if self._ids.is_done(None, line_no):
                    return self._skip()
                raise LineError("duplicate_custom_id", f"line {line_no}: custom_id {custom_id!r} was used "
                                                       "by an earlier line", custom_id)
            if self._ids.is_done(custom_id, line_no):
                return self._skip()
            batch_line = request_of(obj, custom_id, line_no, self._endpoint)
        except LineError as e:
            if self._ids.is_done(None, line_no):
                return self._skip()
            self._emit(line_error_output(line_no, e), ok=False)
            return None
        try:
            made = await ENDPOINTS[batch_line.url](_encoder.encode(batch_line.body), self.upstream)
        except APIError as e:
            self._emit(refused_output(custom_id, new_id("req-"), e), ok=False)
            return None
        if isinstance(made, PoolingJob):
            if made.prompts is None:
                await self._pooling.start(custom_id, made, max(made.priority, self._min_priority))
                return None
            return _LineInFlight(custom_id, made, None, [None] * len(made.prompts), len(made.prompts))
        job, formatter = made
        job.stream = False  # a batch line's answer is one body
        return _LineInFlight(custom_id, job, formatter, [None] * len(job.prompts), len(job.prompts))

    def _skip(self) -> None:
        self.counts.num_skipped += 1
        return None

    def _finish(self, line: _LineInFlight) -> None:
        job = line.job
        failed = next((o for o in line.outputs if o.error_code is not None), None)
        if failed is not None:
            error = from_sdk_error(request_failure(job.request_id, failed.error_code, failed.error_message or ""))
            self._emit(refused_output(line.custom_id, job.request_id, error), ok=False)
            return
        if isinstance(job, PoolingJob):
            body = job.body([o.outputs.data for o in line.outputs], sum(len(o.prompt_token_ids) for o in line.outputs))
            self._pooling_answered(line.custom_id, job, body)
            return
        choices = [GatheredChoice(c.token_ids, [c.text or ""], c.token_logprobs or [], c.finish_reason, c.stop_reason)
                   for output in line.outputs for c in output.outputs]
        usage = job.usage(sum(len(c.token_ids) for c in choices))
        self.counts.num_prompt_tokens += usage["prompt_tokens"]
        self.counts.num_completion_tokens += usage["completion_tokens"]
        self._emit(response_output(line.custom_id, job.request_id, line.formatter.body(job, choices, usage)), ok=True)

    def _pooling_answered(self, custom_id: str, job: PoolingJob, body: dict) -> None:
        self.counts.num_prompt_tokens += body["usage"].get("prompt_tokens", body["usage"]["total_tokens"])
        self._emit(response_output(custom_id, job.request_id, body), ok=True)

    def _pooling_refused(self, custom_id: str, job: PoolingJob, error: APIError) -> None:
        self._emit(refused_output(custom_id, job.request_id, error), ok=False)

    def _emit(self, output: dict, ok: bool) -> None:
        self._write(output)
        if ok:
            self.counts.num_completed += 1
        else:
            self.counts.num_failed += 1
        self._on_line(self.counts, ok)
