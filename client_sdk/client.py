"""AsyncClient: talks to the scheduler's frontend over a ZeroMQ DEALER socket.

One reader task receives every frame and hands each request's outputs to the sink that
waits for it (a stream's queue, a single generate's future, a batch's collector), so any
number of requests share one socket.
"""
import asyncio
import itertools
import uuid
from collections import deque
from typing import AsyncIterator, Callable, Iterable, Sequence

import msgspec
import zmq
import zmq.asyncio

from client_sdk.batch import BatchCollector
from client_sdk.errors import RequestError, ServiceError
from client_sdk.outputs import CompletionOutput, StreamDelta
from client_sdk.tokenizer import IncrementalDecoder, TextCodec
from protocol.client_messages import (Abort, ErrorReply, Generate, GenerateRequest, Health, HealthQuery,
                                      ModelInfo, ModelInfoQuery, RequestOutput, RequestOutputs)
from protocol.codec import encode, scheduler_to_client_decoder
from protocol.sampling import SamplingParams

Prompt = str | Sequence[int]
MAX_REQUESTS_PER_MESSAGE = 2048


def validated(params: SamplingParams | None) -> SamplingParams:
    """Checks the field ranges here, so a bad value fails at the caller, not on the server."""
    params = params or SamplingParams()
    try:
        return msgspec.convert(msgspec.to_builtins(params), SamplingParams)
    except msgspec.ValidationError as e:
        raise ValueError(f"invalid sampling params: {e}") from None


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
        self._sinks: dict[str, Callable[[RequestOutput], None]] = {}
        self._queries: dict[type, deque[asyncio.Future]] = {ModelInfo: deque(), Health: deque()}
        self._ids = itertools.count()
        self._id_prefix = uuid.uuid4().hex[:12]
        self._reader: asyncio.Task | None = None
        self._codec: TextCodec | None = None
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

    async def _text_codec(self) -> TextCodec | None:
        if self._codec is None:
            info = await self.model_info()
            if info.tokenizer_json:
                self._codec = TextCodec(info.tokenizer_json)
        return self._codec

    async def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            codec = await self._text_codec()
            if codec is None:
                raise ServiceError("no_tokenizer", "the model has no tokenizer (or no worker has joined yet): "
                                                   "pass prompt token ids")
            return codec.encode(prompt)
        return list(prompt)

    def _completion(self, request_id: str, token_ids: list[int], last: RequestOutput, logprobs) -> CompletionOutput:
        text = self._codec.decode(token_ids) if self._codec is not None else None
        return CompletionOutput(request_id, token_ids, last.num_prompt_tokens, last.finish_reason, text, logprobs,
                                last.error_code, last.error_message)

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
        await self._sock.send(encode(Abort(ids)))

    async def stream(self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None,
                     priority: int = 0) -> AsyncIterator[StreamDelta]:
        """Yields a delta of new tokens (and text) per step until the request finishes."""
        self._ensure_reader()
        params = validated(params)
        prompt_ids = await self._prompt_ids(prompt)
        await self._text_codec()
        request_id = request_id or self._next_id()
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._claim([request_id])
        self._sinks[request_id] = queue.put_nowait
        decoder = IncrementalDecoder(self._codec) if self._codec is not None else None
        finished = False
        try:
            await self._send_requests([GenerateRequest(request_id, prompt_ids, params, priority, stream=True)])
            while not finished:
                output = await queue.get()
                finished = output.finish_reason is not None
                if output.finish_reason == "error":
                    raise RequestError(request_id, output.error_code or "error", output.error_message or "")
                text = decoder.push(output.new_token_ids, final=finished) if decoder else None
                yield StreamDelta(request_id, output.new_token_ids, text, output.finish_reason,
                                  output.num_prompt_tokens, output.logprobs)
        finally:
            self._sinks.pop(request_id, None)
            if not finished:  # the caller stopped listening: free the request's resources
                await self.abort(request_id)

    async def generate(self, prompt: Prompt, params: SamplingParams | None = None, *,
                       request_id: str | None = None, priority: int = 0) -> CompletionOutput:
        """The whole completion of one prompt; raises RequestError if the server refused it."""
        outputs = await self.generate_batch([prompt], params, request_ids=[request_id] if request_id else None,
                                            priority=priority)
        return outputs[0].raise_for_error()

    async def generate_batch(self, prompts: Sequence[Prompt], params: SamplingParams | None = None, *,
                             window: int | None = None, progress: bool = False, priority: int = 0,
                             request_ids: Sequence[str] | None = None) -> list[CompletionOutput]:
        """Completions of any number of prompts, in input order.

        Every prompt is handed over at once unless `window` bounds how many are in flight.
        A request the server refused comes back with finish_reason "error" (see
        CompletionOutput.raise_for_error) and the others complete as usual.
        """
        self._ensure_reader()
        params = validated(params)
        if any(isinstance(p, str) for p in prompts):
            await self._text_codec()
        ids = list(request_ids) if request_ids else [self._next_id() for _ in prompts]
        collector = BatchCollector(ids, progress=progress)
        self._claim(ids)
        for request_id in ids:
            self._sinks[request_id] = collector.on_output
        try:
            window = window or len(prompts)
            sent = 0
            while sent < len(prompts):
                await collector.wait_for_room(window)
                count = min(window - collector.num_in_flight, len(prompts) - sent)
                chunk = [GenerateRequest(ids[i], await self._prompt_ids(prompts[i]), params, priority)
                         for i in range(sent, sent + count)]
                collector.num_sent += count
                sent += count
                await self._send_requests(chunk)
            await collector.wait_all()
        except BaseException:
            unfinished = collector.unfinished_ids()
            if unfinished:
                await self.abort(unfinished)
            raise
        finally:
            for request_id in ids:
                self._sinks.pop(request_id, None)
            collector.close()
        await self._text_codec()
        return [self._completion(request_id, collector.token_ids[i], collector.last[i], collector.logprobs[i])
                for i, request_id in enumerate(ids)]

    async def close(self) -> None:
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
