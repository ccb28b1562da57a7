"""Serving one OpenAI request, whatever the endpoint: admission, the SDK streams, a JSON body or
server-sent events, usage, errors, and aborting the requests of a client who went away.

An endpoint describes its request as a Job and formats with its own Formatter (completions
and chat differ only in the shape of their chunks and bodies).
"""
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse

from gateway_svc.choices import GatheredChoice, gather_choices, run_choices
from gateway_svc.disconnects import Disconnects
from gateway_svc.errors import APIError, bad_request, from_sdk_error
from gateway_svc.upstream import Upstream
from protocol.client_messages import ModelInfo
from protocol.metrics import RequestTimer
from protocol.pooling import PoolingParams
from protocol.sampling import SamplingParams

_encoder = msgspec.json.Encoder()
DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
    return b"data: " + _encoder.encode(obj) + b"\n\n"


def json_response(obj: dict) -> Response:
    return Response(_encoder.encode(obj), media_type="application/json")


@dataclass
class Job:
    request_id: str
    model_name: str
    prompts: list[list[int]]
    params: list[SamplingParams]
    stream: bool
    include_usage: bool = False
    priority: int = 0
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def num_choices(self) -> int:
        return sum(p.n for p in self.params)

    def usage(self, num_completion_tokens: int) -> dict:
        num_prompt_tokens = sum(map(len, self.prompts))
        return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
                "total_tokens": num_prompt_tokens + num_completion_tokens}


@dataclass
class PoolingJob:
    """A pooling endpoint's request (/v1/embeddings, /v1/score, /v1/rerank, /v1/classify),
    checked: `answer(priority)` runs it whole and returns the response body. One call, no
    stream: its prompts end after one step each."""
    request_id: str
    priority: int
    answer: Callable[[int], Awaitable[dict]]
    # Set when each prompt is one pooling request (embeddings, classify), so a batch file sends
    # them in its one stream of requests (batch_runner): the prompts, their PoolingParams (one
    # per prompt, as Job's), and the body built from each prompt's values, in order, and the
    # number of prompt tokens. None: only `answer` runs it (score, rerank: several per answer).
    prompts: list[str | list[int]] | None = None
    params: list[PoolingParams] | None = None
    body: Callable[[list[list[float]], int], dict] | None = None


@dataclass(frozen=True)
class ListEnvelope:
    """What a pooling endpoint's list answer (/v1/embeddings, /v1/classify, /v1/score) carries
    around its data: its id, model and creation time (when the request was taken), and usage."""
    request_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def body(self, data: list[dict], num_tokens: int) -> dict:
        return {"id": self.request_id, "object": "list", "created": self.created, "model": self.model, "data": data,
                "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}


class Formatter:
    """What an endpoint's bodies look like."""

    def opening_chunks(self, job: Job) -> list[dict]:
        return []

    def chunk(self, job: Job, index: int, delta) -> dict | None:
        raise NotImplementedError

    def usage_chunk(self, job: Job, usage: dict) -> dict:
        raise NotImplementedError

    def body(self, job: Job, choices: list[GatheredChoice], usage: dict) -> dict:
        raise NotImplementedError


def max_tokens_for(info: ModelInfo, prompt_len: int, requested: int | None) -> int:
    """The completion's token budget (unrequested: the room left, at most the model's own default,
    as vLLM's get_max_tokens); a 400 when the prompt and it exceed the model's length."""
    room = info.max_model_len - prompt_len
    if room < 1:
        raise bad_request(f"This model's maximum context length is {info.max_model_len} tokens; the prompt has "
                          f"{prompt_len}, which leaves no room to generate.", "prompt_too_long")
    if requested is None:
        return min(room, info.sampling_defaults.max_tokens or room)
    if requested > room:
        raise bad_request(f"This model's maximum context length is {info.max_model_len} tokens. However, you "
                          f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} "
                          "for the completion).", "prompt_too_long")
    return requested


def check_token_ids(info: ModelInfo, ids: list[int], param: str = "prompt") -> None:
    if not ids:
        raise bad_request(f"the {param} is empty", param=param)
    if min(ids) < 0 or max(ids) >= info.vocab_size:
        raise bad_request(f"{param} token ids must be in [0, {info.vocab_size})", param=param)


async def serve_endpoint(request: Request, upstream: Upstream, make_job) -> Response:
    """One HTTP request of an endpoint: parsed and checked by make_job (completions.completion_job,
    chat.chat_completion_job; a batch line goes through the same), then served."""
    job, fmt = await make_job(await request.body(), upstream)
    return await serve(request, upstream, job, fmt)


async def serve_pooling(request: Request, upstream: Upstream, make_job) -> Response:
    """One HTTP request of a pooling endpoint: checked by make_job (embeddings.embedding_job,
    scores.score_job, ...; a batch line goes through the same), admitted, answered whole."""
    job = await make_job(await request.body(), upstream)
    await upstream.admit()
    timer = RequestTimer(upstream.metrics)
    try:
        body = await _unless_disconnected(request, job.answer(job.priority))
    except (APIError, ClientDisconnect):
        raise
    except Exception as e:
        raise from_sdk_error(e) from None
    finally:
        upstream.release()
    timer.on_finish("stop", body["usage"].get("prompt_tokens", body["usage"]["total_tokens"]))
    return json_response(body)


async def serve(request: Request, upstream: Upstream, job: Job, fmt: Formatter) -> Response:
    await upstream.admit()
    deltas = run_choices(upstream.client, upstream.metrics, job.request_id, job.prompts, job.params, job.priority)
    handed_over = False
    try:
        if not job.stream:
            choices = await _unless_disconnected(request, gather_choices(deltas, job.num_choices))
            usage = job.usage(sum(len(c.token_ids) for c in choices))
            return json_response(fmt.body(job, choices, usage))
        # The first delta before the headers: a refused request still gets its HTTP status.
        first = await _unless_disconnected(request, anext(deltas, None))
        handed_over = True

        async def close() -> None:  # whatever ends the response, exactly once
            upstream.release()
            await deltas.aclose()

        return EventStream(_events(job, fmt, first, deltas), close, upstream.disconnects,
                           media_type="text/event-stream")
    except (APIError, ClientDisconnect):
        raise
    except Exception as e:
        raise from_sdk_error(e) from None
    finally:
        if not handed_over:
            upstream.release()
            await deltas.aclose()


async def _events(job: Job, fmt: Formatter, first, rest: AsyncIterator) -> AsyncIterator[bytes]:
    num_completion_tokens = 0
    try:
        for chunk in fmt.opening_chunks(job):
            yield sse(chunk)
        item = first
        while item is not None:
            index, delta = item
            num_completion_tokens += len(delta.token_ids)
            chunk = fmt.chunk(job, index, delta)
            if chunk is not None:
                yield sse(chunk)
            item = await anext(rest, None)
        if job.include_usage:
            yield sse(fmt.usage_chunk(job, job.usage(num_completion_tokens)))
    except Exception as e:  # after the headers: an error event, as vLLM sends
        yield sse(from_sdk_error(e).body())
    yield DONE


class EventStream(StreamingResponse):
    """Server-sent events that run `close` whatever ends the response (done, failed, or the
    client gone before or during the body), so the requests of a client who went away are
    aborted at once and its admission slot comes back; a client gone is counted."""

    def __init__(self, content, close, disconnects: Disconnects, **kwargs):
        super().__init__(self._to_the_end(content), **kwargs)
        self._close, self._disconnects = close, disconnects
        self._complete = False

    async def _to_the_end(self, content: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            async for chunk in content:
                yield chunk
            self._complete = True
        finally:
            await content.aclose()

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            await self._close()
            if not self._complete:
                self._disconnects.client_gone(scope)


async def _unless_disconnected(request: Request, awaitable):
    """The awaitable's result; ClientDisconnect once the client has disconnected (the awaitable
    is then cancelled)."""
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    raise ClientDisconnect()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
