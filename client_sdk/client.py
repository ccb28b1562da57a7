"""AsyncClient: talks to the scheduler's frontend over a ZeroMQ DEALER socket.

One reader task receives every frame and hands each request's outputs to the sink that
waits for it (a stream's queue, a single generate's future, a batch's collector), so any
number of requests share one socket.
"""
import asyncio
import functools
import itertools
import uuid
from collections import deque
from typing import AsyncIterator, Callable, Iterable, Sequence

import zmq
import zmq.asyncio

from client_sdk.batch import BatchCollector
from client_sdk.chat_template import render_chat
from client_sdk.choice import Choice, choice_params, params_per_prompt, validated
from client_sdk.errors import ChatTemplateError, RequestError, ServiceError
from client_sdk.outputs import RequestOutput, StreamDelta
from client_sdk.tokenizer import TextCodec
from protocol.client_messages import (Abort, ErrorReply, Generate, GenerateRequest, Health, HealthQuery,
                                      ModelInfo, ModelInfoQuery, RequestOutputs)
from protocol.client_messages import RequestOutput as WireOutput
from protocol.codec import encode, scheduler_to_client_decoder
from protocol.sampling import SamplingParams

Prompt = str | Sequence[int]
MAX_REQUESTS_PER_MESSAGE = 2048


def _put_indexed(put: Callable, index: int, output: WireOutput) -> None:
    put((index, output))


class AsyncClient:
    def __init__(self, address: str = "tcp://127.0.0.1:5555", *, timeout_s: float | None = None):
        self.address = address
        self.timeout_s = timeout_s  # for model_info / health replies
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        self._sock.connect(address)
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
        self.last_error: ErrorReply | None = None

    # ---- plumbing ------------------------------------------------------------------

    def _ensure_reader(self) -> None:
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    async def _read_loop(self) -> None:
        while True:
            frame = await self._sock.recv(copy=False)
            message = self._decoder.decode(frame.buffer)
            if isinstance(message, RequestOutputs):
                for output in message.outputs:
                    sink = self._sinks.get(output.request_id)
                    if sink is not None:
                        sink(output)
            elif isinstance(message, ErrorReply):
                self.last_error = message
                for waiting in self._queries.values():
                    while waiting:
                        future = waiting.popleft()
                        if not future.done():
                            future.set_exception(ServiceError(message.code, message.message))
            else:
                waiting = self._queries[type(message)]
                if waiting:
                    future = waiting.popleft()
                    if not future.done():
                        future.set_result(message)

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
        request_id = request_id or self._next_id()
        choice_ids = self._choice_ids(request_id, params)
        try:
            self._claim(choice_ids)
        except ValueError:
            self._choice_ids_of.pop(request_id, None)
            raise
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
                    raise RequestError(request_id, choice.error_code or "error", choice.error_message or "")
                if choice.finished:
                    num_open -= 1
                    if choice.stopped_by_string:
                        self._abort_soon([choice_ids[index]])
                text = choice.text.take_delta(choice.finished) if choice.text is not None else None
                yield StreamDelta(request_id, new_ids, text, choice.finish_reason, output.num_prompt_tokens,
                                  new_logprobs, index, choice.stop_reason)
        finally:
            for choice_id in choice_ids:
                self._sinks.pop(choice_id, None)
            self._choice_ids_of.pop(request_id, None)
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
                             window: int | None = None, progress: bool = False, priority: int = 0,
                             request_ids: Sequence[str] | None = None) -> list[RequestOutput]:
        """Outputs of any number of prompts, in input order; params: one for all, or one each.

        Every prompt is handed over at once unless `window` bounds how many requests (choices)
        are in flight. A request the server refused comes back with finish_reason "error" (see
        RequestOutput.raise_for_error) and the others complete as usual.
        """
        self._ensure_reader()
        params_of = params_per_prompt(params, len(prompts))
        if any(p.stop for p in params_of):
            await self.text_codec()  # stop strings are matched on text
        elif any(isinstance(p, str) for p in prompts):
            await self._text_codec()
        codec = self._codec
        ids = list(request_ids) if request_ids else [self._next_id() for _ in prompts]
        if len(ids) != len(prompts):
            raise ValueError(f"{len(ids)} request ids for {len(prompts)} prompts")
        collector = BatchCollector(progress=progress, on_stop_string=self._abort_soon)
        choice_ids = [self._choice_ids(rid, p) for rid, p in zip(ids, params_of)]
        flat_ids = [choice_id for group in choice_ids for choice_id in group]
        try:
            self._claim(flat_ids)
        except ValueError:
            for rid in ids:
                self._choice_ids_of.pop(rid, None)
            raise
        for group, p in zip(choice_ids, params_of):
            for index, choice_id in enumerate(group):  # stop strings: see every step, to abort at a match
                collector.add(choice_id, Choice(index, p, codec, incremental=bool(p.stop)))
                self._sinks[choice_id] = collector.on_output
        prompt_ids: list[list[int]] = [[] for _ in prompts]
        try:
            window = window or len(flat_ids)
            i = 0
            while i < len(prompts):
                await collector.wait_for_room(window)
                room, chunk = window - collector.num_in_flight, []
                while i < len(prompts) and (room > 0 or not chunk):
                    prompt_ids[i] = await self._prompt_ids(prompts[i])
                    chunk += [GenerateRequest(choice_id, prompt_ids[i], choice_params(params_of[i], index), priority,
                                              stream=bool(params_of[i].stop))
                              for index, choice_id in enumerate(choice_ids[i])]
                    room -= len(choice_ids[i])
                    i += 1
                collector.num_sent += len(chunk)
                await self._send_requests(chunk)
            await collector.wait_all()
        except BaseException:
            unfinished = collector.unfinished_ids()
            if unfinished:
                self._abort_soon(unfinished)
            raise
        finally:
            for choice_id in flat_ids:
                self._sinks.pop(choice_id, None)
            for rid in ids:
                self._choice_ids_of.pop(rid, None)
            collector.close()
        await self._text_codec()
        for group in choice_ids:
            for choice_id in group:
                collector.choices[choice_id].codec = self._codec
        return [RequestOutput(rid, prompt if isinstance(prompt, str) else None, prompt_ids[i],
                              [collector.choices[choice_id].output() for choice_id in choice_ids[i]])
                for i, (rid, prompt) in enumerate(zip(ids, prompts))]

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
        self._sock.close(linger=0)
        self._ctx.term()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
