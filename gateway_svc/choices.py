"""Running one HTTP request's prompts: each prompt is one SDK stream (its n choices interleaved),
the streams merged into one sequence of (choice index, delta), every delta timed for the
metrics. Streamed responses format the deltas as they come; others gather them (Gathered)."""
import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from client_sdk.client import AsyncClient
from client_sdk.outputs import StreamDelta
from protocol.metrics import RequestTimer, ServingMetrics
from protocol.sampling import SamplingParams


async def run_choices(client: AsyncClient, metrics: ServingMetrics, request_id: str, prompts: list[list[int]],
                      params: list[SamplingParams], priority: int = 0) -> AsyncIterator[tuple[int, StreamDelta]]:
    """(choice index, delta) for every delta of every prompt; prompt i's choice j is index
    i * n + j, as OpenAI numbers the choices of a list of prompts."""
    arrival = time.monotonic()
    streams = [client.stream(ids, p, request_id=f"{request_id}-{i}", priority=priority)
               for i, (ids, p) in enumerate(zip(prompts, params))]
    timers: dict[int, RequestTimer] = {}
    async for i, delta in _merged(streams):
        index = i * params[i].n + delta.index
        timer = timers.get(index)
        if timer is None:
            timer = timers[index] = RequestTimer(metrics, arrival)
        timer.on_tokens(len(delta.token_ids))
        if delta.finish_reason is not None:
            timer.on_finish(delta.finish_reason, delta.num_prompt_tokens)
        yield index, delta


async def _merged(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    if len(streams) == 1:  # the common case: no tasks, no queue
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator) -> None:
        try:
            async for item in stream:
                queue.put_nowait((i, item))
            queue.put_nowait((i, done))
        except BaseException as e:  # handed to the consumer, which re-raises it
            queue.put_nowait((i, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        num_open = len(tasks)
        while num_open:
            i, item = await queue.get()
            if item is done:
                num_open -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:  # a failure or a client gone: the other streams abort their requests
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class GatheredChoice:
    token_ids: list[int] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_logprobs: list | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


async def gather_choices(deltas: AsyncIterator[tuple[int, StreamDelta]], num_choices: int
                         ) -> list[GatheredChoice]:
    """The whole choices, for a response that is not streamed."""
    choices = [GatheredChoice() for _ in range(num_choices)]
    async for index, delta in deltas:
        choice = choices[index]
        choice.token_ids += delta.token_ids
        if delta.text:
            choice.text_parts.append(delta.text)
        if delta.logprobs:
            choice.logprobs += delta.logprobs
        if delta.prompt_logprobs is not None:
            choice.prompt_logprobs = delta.prompt_logprobs
        if delta.finish_reason is not None:
            choice.finish_reason, choice.stop_reason = delta.finish_reason, delta.stop_reason
    return choices
