"""PoolingLines: a batch's pooling lines whose answer is not one pooling request per prompt
(/v1/score, /v1/rerank: pairs, cosines, ranks; PoolingJob.prompts None) in flight. Each is one
call of its PoolingJob, run as a task of its own; at most `window` at once, so memory holds the
window, never the file. Embedding and classify lines stream with the rest (batch_runner)."""
import asyncio
from collections.abc import Callable

from gateway_svc.errors import APIError, from_sdk_error
from gateway_svc.responses import PoolingJob


class PoolingLines:
    def __init__(self, window: int, on_body: Callable[[str, PoolingJob, dict], None],
                 on_error: Callable[[str, PoolingJob, APIError], None]):
        """on_body / on_error: called with the line's custom_id and job, and its response body or
        the endpoint's error, as each line ends."""
        self._slots = asyncio.Semaphore(max(window, 1))
        self._tasks: set[asyncio.Task] = set()
        self._on_body, self._on_error = on_body, on_error

    async def start(self, custom_id: str, job: PoolingJob, priority: int) -> None:
        """Starts the line once fewer than `window` are in flight (waits until then)."""
        await self._slots.acquire()
        task = asyncio.ensure_future(self._answer(custom_id, job, priority))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def wait(self) -> None:
        """Until every line started has ended."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def cancel(self) -> None:
        """Aborts the lines in flight (they get no output line)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _answer(self, custom_id: str, job: PoolingJob, priority: int) -> None:
        try:
            body = await job.answer(priority)
        except Exception as e:
            self._on_error(custom_id, job, e if isinstance(e, APIError) else from_sdk_error(e))
            return
        self._on_body(custom_id, job, body)
