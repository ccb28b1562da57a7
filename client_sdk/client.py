"""AsyncClient: talks to the scheduler's frontend over a ZeroMQ DEALER socket.

One reader task receives every frame and hands each request's outputs to the sink that
waits for it (a stream's queue, a single generate's future, a batch's collector), so any
number of requests share one socket. The same task reads the socket's monitor
(connection.py): a refused handshake or a closed connection fails the live requests at once.
"""
import asyncio
import functools
import itertools
import uuid
import weakref
from collections import deque
from typing import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Sequence

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from client_sdk.batch import BatchCollector, PromptInFlight
from client_sdk.chat_template import render_chat
from client_sdk.choice import Choice, choice_params, params_per_prompt, validated
from client_sdk.connection import MONITORED_EVENTS, ConnectionState
from client_sdk.deadlines import Deadlines
from client_sdk.errors import ChatTemplateError, ServiceError, request_failure
from client_sdk.outputs import prompt_logprobs, RequestOutput, StreamDelta
from client_sdk.tokenizer import TextCodec
from protocol.client_messages import (Abort, ErrorReply, Generate, GenerateRequest, Health, HealthQuery,
                                      ModelInfo, ModelInfoQuery, RequestOutputs)
from protocol.client_messages import RequestOutput as WireOutput
from protocol.codec import encode, scheduler_to_client_decoder
from protocol.curve import connecting_keys, secure_connecting_socket
from protocol.errors import ErrorCode
from protocol.limits import MAX_REQUESTS_PER_MESSAGE
from protocol.sampling import SamplingParams

Prompt = str | Sequence[int]
# A batch larger than this asks the scheduler's --max-queued-requests once, and keeps at most half
# of it in flight when no window is given (room for a second client's batch).
SMALL_BATCH = 4096


def _put_indexed(put: Callable, index: int, output: WireOutput) -> None:
    put((index, output))


def _per_prompt(value, scalar_type: type) -> Iterator:
    """One value for every prompt, or an iterable of one each."""
    if value is None or isinstance(value, scalar_type):
        return itertools.repeat(value)
    return iter(value)


async def _aiter_of(items: Iterable | AsyncIterable) -> AsyncIterator:
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def _zip_inputs(prompts: Iterable | AsyncIterable, params: Iterator, priorities: Iterator,
                      request_ids: Iterator | None) -> AsyncIterator[tuple]:
    """(prompt, params, priority, request id) per prompt, read one at a time."""
    index = 0
    async for prompt in _aiter_of(prompts):
        try:
            item = (prompt, next(params), next(priorities), next(request_ids) if request_ids is not None else None)
        except StopIteration:
            raise ValueError(f"more prompts than sampling params, priorities or request ids (prompt {index})") from None
        yield item
        index += 1


def _release(ctx: zmq.asyncio.Context, sock: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
    """Closes the sockets, then the context: a context collected with a socket open would block
    in term(), so a client dropped without close() releases them through a finalizer."""
    if not sock.closed:
        sock.disable_monitor()
    monitor.close(linger=0)
    sock.close(linger=0)
    ctx.term()


def _error_output(request_id: str, code: str, message: str) -> WireOutput:
    return WireOutput(request_id, [], 0, "error", None, code, message)


class AsyncClient:
    def __init__(self, address: str = "tcp://127.0.0.1:5555", *, timeout_s: float | None = None,
                 request_timeout_s: float | None = None, curve_server_key: str | None = None,
                 curve_secret_key: str | None = None):
        """timeout_s: for model_info / health replies (default: request_timeout_s). request_timeout_s:
        a request not finished that long after it was sent fails with ServiceError("timeout"). curve_server_key (the
        scheduler's public certificate) and curve_secret_key (this client's secret certificate):
        CurveZMQ, also from $STEPSERVE_CURVE_SERVER_KEY / $STEPSERVE_CURVE_SECRET_KEY (or
        $STEPSERVE_CURVE_KEYS, a folder from `stepserve keys generate`)."""
        self.address = address
        self.timeout_s = timeout_s or request_timeout_s
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        keys = connecting_keys("client", curve_server_key, curve_secret_key)
        secure_connecting_socket(self._sock, keys)
        self._monitor = self._sock.get_monitor_socket(MONITORED_EVENTS)
        self._release = weakref.finalize(self, _release, self._ctx, self._sock, self._monitor)
        self._connection = ConnectionState(address, uses_curve=keys is not None)
        self._sock.connect(address)
        self._deadlines = Deadlines(request_timeout_s, self._on_timeouts) if request_timeout_s else None
        self._deadline_task: asyncio.Task | None = None
        self._decoder = scheduler_to_client_decoder()
        self._sinks: dict[str, Callable[[WireOutput], None]] = {}
        self._queries: dict[type, deque[asyncio.Future]] = {ModelInfo: deque(), Health: deque()}
        self._ids = itertools.count()
        self._id_prefix = uuid.uuid4().hex[:12]
        self._reader: asyncio.Task | None = None
        self._codec: TextCodec | None = None
        self._model_info: ModelInfo | None = None  # once a worker has joined
        self._choice_ids_of: dict[str, list[str]] = {}  # a live request with n > 1 -> its choices' ids
        self._background: set[asyncio.Task] = set()
        self._max_queued_requests: int | None = None  # the scheduler's, asked for big batches

    # ---- plumbing ------------------------------------------------------------------

    def _ensure_reader(self) -> None:
        if self._connection.auth_error is not None:
            raise self._connection.auth_error
        if self._reader is None:
            loop = asyncio.get_running_loop()
            self._reader = loop.create_task(self._read_loop())
            if self._deadlines is not None:
                self._deadline_task = loop.create_task(self._deadlines.run())

    async def _read_loop(self) -> None:
        poller = zmq.asyncio.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            ready = dict(await poller.poll())
            # Every message first: a closed connection's last outputs are queued before its event.
            while True:
                try:
                    frame = await self._sock.recv(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._dispatch(self._decoder.decode(frame.buffer))
            if self._monitor in ready:
                event = parse_monitor_message(await self._monitor.recv_multipart())["event"]
                lost = self._connection.on_event(event)
                if lost is not None:
                    self._fail_live(*lost)

    def _dispatch(self, message) -> None:
        if isinstance(message, RequestOutputs):
            for output in message.outputs:
                sink = self._sinks.get(output.request_id)
                if sink is not None:
                    sink(output)
        elif isinstance(message, ErrorReply):
            self._fail_queries(ServiceError(message.code, message.message))
        else:
            waiting = self._queries[type(message)]
            if waiting:
                future = waiting.popleft()
                if not future.done():
                    future.set_result(message)

    def _fail_queries(self, error: Exception) -> None:
        for waiting in self._queries.values():
            while waiting:
                future = waiting.popleft()
                if not future.done():
                    future.set_exception(error)

    def _fail_live(self, code: str, message: str) -> None:
        """Every live request and query ends with this error (the connection lost them)."""
        ids = list(self._sinks)
        for request_id in ids:
            sink = self._sinks.get(request_id)
            if sink is not None:
                sink(_error_output(request_id, code, message))
        self._fail_queries(self._connection.auth_error or ServiceError(code, message))
        if ids and code != ErrorCode.AUTHENTICATION_FAILED:
            self._abort_soon(ids)  # one still in the socket's queue must not run on the new scheduler

    def _on_timeouts(self, expired: list[tuple[str, object]]) -> None:
        timed_out = []
        for request_id, sink in expired:
            if self._sinks.get(request_id) is sink:
                timed_out.append(request_id)
                sink(_error_output(request_id, ErrorCode.TIMEOUT,
                                   f"not finished within request_timeout_s ({self._deadlines.timeout_s:g} s)"))
        if timed_out:
            self._abort_soon(timed_out)

    async def _query(self, query, reply_type):
        self._ensure_reader()
        future = asyncio.get_running_loop().create_future()
        self._queries[reply_type].append(future)
        await self._sock.send(encode(query))
        try:
            return await asyncio.wait_for(future, self.timeout_s)
        except asyncio.TimeoutError:
            raise ServiceError("timeout", f"no reply from {self.address} in {self.timeout_s} s") from None

    def _claim(self, request_ids: list[str]) -> None:
        """One live request per id on this client: a second would steal the first's outputs."""
        taken = [rid for rid in request_ids if rid in self._sinks]
        if taken or len(set(request_ids)) != len(request_ids):
            raise ValueError(f"request ids already in use on this client: {taken or 'duplicates in the batch'}")

    def _next_id(self) -> str:
        return f"{self._id_prefix}-{next(self._ids)}"

    async def _send_requests(self, requests: list[GenerateRequest]) -> None:
        if self._deadlines is not None:
            self._deadlines.add([(r.request_id, self._sinks.get(r.request_id)) for r in requests])
        for start in range(0, len(requests), MAX_REQUESTS_PER_MESSAGE):
            await self._sock.send(encode(Generate(requests[start:start + MAX_REQUESTS_PER_MESSAGE])))

    async def served_model(self) -> ModelInfo:
        """The model info, asked once a worker has joined (before that, on every call)."""
        if self._model_info is None:
            info = await self.model_info()
            if info.model is None:
                return info
            self._model_info = info
        return self._model_info

    async def _text_codec(self) -> TextCodec | None:
        if self._codec is None:
            info = await self.served_model()
            if info.tokenizer_json:
                self._codec = TextCodec(info.tokenizer_json)
        return self._codec

    async def text_codec(self, required: bool = True) -> TextCodec | None:
        """The model's tokenizer; when it has none (or no worker has joined yet), ServiceError
        or, with required=False, None."""
        codec = await self._text_codec()
        if codec is None and required:
            raise ServiceError("no_tokenizer", "the model has no tokenizer (or no worker has joined yet): "
                                               "pass prompt token ids")
        return codec

    async def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return (await self.text_codec()).encode(prompt)
        return list(prompt)

    def _abort_soon(self, request_ids: list[str]) -> None:
        """An abort that must not wait, nor be lost to a cancellation: from a finally block of a
        cancelled stream (a client that went away), or from the reader (a stop string matched)."""
        task = asyncio.get_running_loop().create_task(self.abort(request_ids))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _claim_choices(self, request_id: str | None, params: SamplingParams) -> tuple[str, list[str]]:
        """The request's id (a new one when None) and its choices' ids, claimed on this client
        (_forget releases them)."""
        request_id = request_id or self._next_id()
        choice_ids = self._choice_ids(request_id, params)
        try:
            self._claim(choice_ids)
        except ValueError:
            self._choice_ids_of.pop(request_id, None)
            raise
        return request_id, choice_ids

    def _forget(self, request_id: str, choice_ids: list[str]) -> None:
        for choice_id in choice_ids:
            self._sinks.pop(choice_id, None)
        self._choice_ids_of.pop(request_id, None)

    def _choice_ids(self, request_id: str, params: SamplingParams) -> list[str]:
        """The scheduler's request ids of the n choices: the id itself when n is 1."""
        if params.n == 1:
            return [request_id]
        ids = [f"{request_id}-{index}" for index in range(params.n)]
        self._choice_ids_of[request_id] = ids
        return ids

    # ---- public API ----------------------------------------------------------------

    async def model_info(self) -> ModelInfo:
        return await self._query(ModelInfoQuery(), ModelInfo)

    async def health(self) -> Health:
        return await self._query(HealthQuery(), Health)

    async def wait_for_workers(self, num_workers: int = 1, timeout_s: float = 120.0) -> Health:
        """Polls health until that many workers have joined."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            health = await self.health()
            if health.num_workers >= num_workers:
                return health
            if loop.time() > deadline:
                raise ServiceError("timeout", f"{health.num_workers} of {num_workers} workers joined in {timeout_s} s")
            await asyncio.sleep(0.05)

    async def abort(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        ids = [choice_id for rid in ids for choice_id in self._choice_ids_of.get(rid, (rid,))]
        await self._sock.send(encode(Abort(ids)))

    async def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                                  chat_template: str | None = None, tokenize: bool = True, **kwargs):
        """The conversation rendered with the model's chat template (or `chat_template`), as
        transformers' apply_chat_template does: token ids, or the text with tokenize=False.
        ChatTemplateError when the model has no template."""
        info = await self.served_model()
        template = chat_template or info.chat_template
        if template is None:
            raise ChatTemplateError(f"the model {info.model!r} has no chat template (no chat_template in its "
                                    "tokenizer_config.json, no chat_template.jinja): pass one, or prompt it directly")
        text = render_chat(template, messages, info.special_tokens, add_generation_prompt=add_generation_prompt,
                           **kwargs)
        return (await self.text_codec()).encode(text, add_special_tokens=False) if tokenize else text

    async def stream(self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None,
                     priority: int = 0) -> AsyncIterator[StreamDelta]:
        """Yields a delta of new tokens (and text) per step until the request finishes; with
        n > 1 the deltas of the n choices interleave, told apart by `index`."""
        self._ensure_reader()
        params = validated(params)
        prompt_ids = await self._prompt_ids(prompt)
        codec = await (self.text_codec() if params.stop else self._text_codec())
        request_id, choice_ids = self._claim_choices(request_id, params)
        queue: asyncio.Queue[tuple[int, WireOutput]] = asyncio.Queue()
        choices = [Choice(index, params, codec, incremental=True) for index in range(params.n)]
        for index, choice_id in enumerate(choice_ids):
            self._sinks[choice_id] = functools.partial(_put_indexed, queue.put_nowait, index)
        num_open = len(choices)
        try:
            await self._send_requests([GenerateRequest(choice_id, prompt_ids, choice_params(params, index), priority,
                                                       stream=True) for index, choice_id in enumerate(choice_ids)])
            while num_open:
                index, output = await queue.get()
                choice = choices[index]
                if choice.finished:
                    continue  # after a stop string: the scheduler's abort reply
                new_ids, new_logprobs = choice.add(output)
                if choice.finish_reason == "error":
                    raise request_failure(request_id, choice.error_code or "error", choice.error_message or "")
                if choice.finished:
                    num_open -= 1
                    if choice.stopped_by_string:
                        self._abort_soon([choice_ids[index]])
                text = choice.text.take_delta(choice.finished) if choice.text is not None else None
                yield StreamDelta(request_id, new_ids, text, choice.finish_reason, output.num_prompt_tokens,
                                  new_logprobs, index, choice.stop_reason, output.prompt_logprobs)
        finally:
            self._forget(request_id, choice_ids)
            unfinished = [choice_ids[c.index] for c in choices if not c.finished]
            if unfinished:  # the caller stopped listening (or one choice failed): free the rest
                self._abort_soon(unfinished)

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None, *,
                       request_id: str | None = None, priority: int = 0) -> RequestOutput:
        """The whole output of one prompt; raises RequestError if the server refused it."""
        outputs = await self.generate_batch([prompt], params, request_ids=[request_id] if request_id else None,
                                            priority=priority)
        return outputs[0].raise_for_error()

    async def generate_batch(self, prompts: Sequence[Prompt],
                             params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                             window: int | None = None, progress: bool = False,
                             priority: int | Sequence[int] = 0,
                             request_ids: Sequence[str] | None = None) -> list[RequestOutput]:
        """Outputs of any number of prompts, in input order; params: one for all, or one each.

        `window` bounds how many requests (choices) are in flight; by default every prompt is
        handed over at once, up to half the scheduler's --max-queued-requests (asked once). A
        request that failed (refused: overloaded, shutting_down, ...; or lost with its
        scheduler, or timed out) comes back with finish_reason "error" and its error_code (see
        RequestOutput.raise_for_error); the others complete as usual. Only a refused CurveZMQ
        handshake raises (AuthenticationError): then nothing can be served.
        """
        if request_ids is not None and len(request_ids) != len(prompts):
            raise ValueError(f"{len(request_ids)} request ids for {len(prompts)} prompts")
        params_of = params_per_prompt(params, len(prompts))
        if window is None:
            window = await self._default_window(sum(p.n for p in params_of))
        outputs: list[RequestOutput | None] = [None] * len(prompts)
        async for index, output in self.generate_iter(prompts, params_of, window=window, progress=progress,
                                                      priority=priority, request_ids=request_ids):
            outputs[index] = output
        return outputs

    async def generate_iter(self, prompts: Iterable[Prompt] | AsyncIterable[Prompt],
                            params: SamplingParams | Iterable[SamplingParams] | None = None, *,
                            window: int | None = None, progress: bool = False,
                            priority: int | Iterable[int] = 0, request_ids: Iterable[str] | None = None
                            ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(index, RequestOutput) for each prompt as it finishes, in the order they finish.

        prompts: any iterable or async iterable, read lazily: only as many prompts as the
        window holds are read, tokenized and in flight at once, and a prompt's state is
        dropped when it is yielded, so memory stays flat however many there are. params and
        priority: one for all, or an iterable of one per prompt (read alongside). window:
        requests (choices) in flight; by default the prompts' count when it is known and at
        most SMALL_BATCH, else SMALL_BATCH. Failed requests come back as in generate_batch.
        Closing the iterator early aborts what is in flight.
        """
        if window is None:
            window = min(len(prompts), SMALL_BATCH) if hasattr(prompts, "__len__") else SMALL_BATCH
        items = _zip_inputs(prompts, _per_prompt(params, SamplingParams), _per_prompt(priority, int),
                            iter(request_ids) if request_ids is not None else None)
        async for index, output in self.generate_iter_items(
                items, window=window, progress=progress, total=len(prompts) if hasattr(prompts, "__len__") else None):
            yield index, output

    async def generate_iter_items(self, items: Iterable[tuple] | AsyncIterable[tuple], *, window: int = SMALL_BATCH,
                                  progress: bool = False, total: int | None = None
                                  ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """generate_iter for items (prompt, params, priority[, request_id]) read one at a time:
        for callers whose prompts and parameters come together (a batch file's lines)."""
        self._ensure_reader()
        items = _aiter_of(items)
        # The tokenizer that decodes the outputs is asked for alongside the requests, not after
        # them: by then a killed scheduler could not answer, and the batch would be lost whole.
        tokenizer_asked = None if self._model_info is not None else self._ask_soon(self._text_codec())
        collector = BatchCollector(total, progress, on_stop_string=self._abort_soon)
        live: dict[int, PromptInFlight] = {}
        given = checked = None  # the same params object for many prompts in a row: checked once
        codec_ready = False
        try:
            exhausted = False
            index = 0
            while True:
                while collector.ready:
                    if self._connection.auth_error is not None:
                        raise self._connection.auth_error
                    entry = collector.ready.popleft()
                    if not codec_ready and any(c.token_ids for c in entry.choices):
                        await self._codec_for_outputs(tokenizer_asked)
                        codec_ready = True
                    del live[entry.index]
                    self._forget(entry.request_id, entry.choice_ids)
                    yield entry.index, self._request_output(entry)
                chunk: list[GenerateRequest] = []
                while not exhausted and collector.num_in_flight + len(collector.ready) < max(window, 1):
                    item = await anext(items, None)
                    if item is None:
                        exhausted = True
                        break
                    prompt, p, prio, *request_id = item
                    request_id = request_id[0] if request_id else None
                    if p is not given or checked is None:
                        given, checked = p, validated(p)
                    entry = await self._prompt_in_flight(index, prompt, checked, request_id)
                    collector.add(entry)
                    live[index] = entry
                    for choice_id in entry.choice_ids:
                        self._sinks[choice_id] = collector.on_output
                    p = entry.choices[0].params
                    chunk += [GenerateRequest(choice_id, entry.prompt_ids, choice_params(p, c), prio,
                                              stream=bool(p.stop)) for c, choice_id in enumerate(entry.choice_ids)]
                    index += 1
                if chunk:
                    await self._send_requests(chunk)
                if exhausted and not live:
                    return
                if not collector.ready:
                    await collector.wait_for_change()
        finally:
            unfinished = collector.unfinished_ids()
            if unfinished:
                self._abort_soon(unfinished)
            if tokenizer_asked is not None and not tokenizer_asked.done():
                tokenizer_asked.cancel()
            for entry in live.values():
                self._forget(entry.request_id, entry.choice_ids)
            collector.close()

    async def _prompt_in_flight(self, index: int, prompt: Prompt, params: SamplingParams,
                                request_id: str | None) -> PromptInFlight:
        """A prompt tokenized and its choices claimed, ready to be sent."""
        if params.stop:
            await self.text_codec()  # stop strings are matched on text
        prompt_ids = await self._prompt_ids(prompt)
        request_id, choice_ids = self._claim_choices(request_id, params)
        # stop strings: see every step, to abort at a match
        choices = [Choice(c, params, self._codec, incremental=bool(params.stop)) for c in range(params.n)]
        return PromptInFlight(index, request_id, prompt if isinstance(prompt, str) else None, prompt_ids,
                              choice_ids, choices)

    def _request_output(self, entry: PromptInFlight) -> RequestOutput:
        for choice in entry.choices:
            choice.codec = self._codec
        first = entry.choices[0]
        return RequestOutput(entry.request_id, entry.prompt, entry.prompt_ids, [c.output() for c in entry.choices],
                             prompt_logprobs=prompt_logprobs(first.prompt_token_logprobs, self._codec),
                             prompt_token_logprobs=first.prompt_token_logprobs)

    def _ask_soon(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a failure is read by whoever awaits it
        return task

    async def _codec_for_outputs(self, asked: asyncio.Task | None) -> None:
        """The tokenizer for a batch's outputs, from the question asked as it began (or, when no
        worker had joined by then, asked now). A scheduler lost before it answered (its error fails
        the question too) leaves the outputs with their token ids and no text."""
        try:
            if asked is not None:
                await asked
            if self._model_info is None:  # nothing to ask a scheduler that served nothing
                await self._text_codec()
        except ServiceError:
            pass

    async def _default_window(self, num_requests: int) -> int:
        if num_requests <= SMALL_BATCH:
            return num_requests
        if self._max_queued_requests is None:
            self._max_queued_requests = (await self.model_info()).max_queued_requests
        return max(1, self._max_queued_requests // 2) if self._max_queued_requests else num_requests

    async def close(self) -> None:
        if self._background:  # the last aborts; a socket that never connected cannot send them
            _, unsent = await asyncio.wait(self._background, timeout=1.0)
            for task in unsent:
                task.cancel()
        for task in (self._reader, self._deadline_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        self._release()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
