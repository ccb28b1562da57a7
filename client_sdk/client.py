"""AsyncClient: the SDK's request API (generate, stream, generate_batch, generate_iter, model
info, health, abort) over one connection to the scheduler's frontend.

The connection, its reader task, the sinks that take each request's outputs and the deadlines
are the transport's (transport.py); a request's choices are claimed, given their sinks and
released through LiveChoices (live_choices.py), the one helper every call shares.

Every call shares the model info and the tokenizer the client caches, so the calls are methods
of one class; what needs neither lives beside it (batch.py, batch_inputs.py, choice.py).
"""
import asyncio
import contextlib
import functools
from dataclasses import dataclass, field
from typing import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence

from client_sdk.batch import BatchCollector, PromptInFlight
from client_sdk.batch_inputs import aiter_of, per_prompt, prompt_items
from client_sdk.chat_template import render_chat
from client_sdk.choice import POOLING_SAMPLING, Choice, choice_params, params_per_prompt, validated, validated_pooling
from client_sdk.errors import ChatTemplateError, PromptTooLong, RequestError, ServiceError, request_failure
from client_sdk.live_choices import LiveChoices
from client_sdk.model_defaults import default_sampling_params
from client_sdk.outputs import RequestOutput, StreamDelta, prompt_logprobs
from client_sdk.pooling_calls import PoolingCalls
from client_sdk.pooling_outputs import PoolingOutput, PoolingRequestOutput, floats_of
from client_sdk.tokenizer import TextCodec, off_loop
from client_sdk.transport import Sink, Transport, error_output
from protocol.client_messages import GenerateRequest, Health, HealthQuery, ModelInfo, ModelInfoQuery, request_refusal
from protocol.client_messages import RequestOutput as WireOutput
from protocol.errors import ErrorCode
from protocol.pooling import PoolingParams
from protocol.sampling import SamplingParams

Prompt = str | Sequence[int]
# A batch larger than this asks the scheduler's --max-queued-requests once, and keeps at most half
# of it in flight when no window is given (room for a second client's batch).
SMALL_BATCH = 4096


def _put_indexed(put: Callable, index: int, output: WireOutput) -> None:
    put((index, output))


@dataclass(slots=True)
class _BatchRun:
    """The state of one generate_iter_items call, released by _end_batch_run."""
    items: AsyncIterator[tuple]
    window: int  # requests (choices) in flight, or ready and not handed over
    collector: BatchCollector
    tokenizer_asked: asyncio.Task | None  # see _codec_for_outputs
    live: dict[int, PromptInFlight] = field(default_factory=dict)  # by index: their choice ids are claimed
    num_read: int = 0
    exhausted: bool = False
    codec_ready: bool = False  # _codec_for_outputs has been awaited
    # the last item's params, and what they validated to (_validated_once)
    given_params: SamplingParams | PoolingParams | None = None
    checked_params: SamplingParams | PoolingParams | None = None

    @property
    def has_room(self) -> bool:
        return self.collector.num_in_flight + len(self.collector.ready) < max(self.window, 1)


class AsyncClient(PoolingCalls):
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
        self._transport = Transport(address, request_timeout_s=request_timeout_s,
                                    curve_server_key=curve_server_key, curve_secret_key=curve_secret_key)
        self._live = LiveChoices(self._transport)
        self._codec: TextCodec | None = None
        self._model_info: ModelInfo | None = None  # once a worker has joined
        self._max_queued_requests: int | None = None  # the scheduler's, asked for big batches

    # ---- helpers -------------------------------------------------------------------

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
                # Off the loop: building a large vocabulary takes a while (once per client).
                self._codec = await off_loop(TextCodec, info.tokenizer_json, info.max_model_len)
        return self._codec

    async def text_codec(self, required: bool = True) -> TextCodec | None:
        """The model's tokenizer; when it has none (or no worker has joined yet), ServiceError
        or, with required=False, None."""
        codec = await self._text_codec()
        if codec is None and required:
            raise ServiceError("no_tokenizer", "the model has no tokenizer (or no worker has joined yet): "
                                               "pass prompt token ids")
        return codec

    async def _checked_prompt(self, prompt: Prompt, choice_ids: list[str], pooling: PoolingParams | None = None
                              ) -> tuple[list[int], tuple | None]:
        """The prompt's token ids (a long text tokenized off the event loop), and (error code,
        message) when the scheduler would refuse the request: said here at once, never sent."""
        try:
            prompt_ids = (await (await self.text_codec()).encode_async([prompt]))[0] \
                if isinstance(prompt, str) else list(prompt)
        except PromptTooLong as e:  # a text past the model's context, untokenized
            return [], (e.code, str(e))
        # the longest id: the others pass if it does
        refusal = request_refusal(max(choice_ids, key=len), prompt_ids, pooling)
        return prompt_ids, (ErrorCode.INVALID_PARAMS, refusal) if refusal else None

    # ---- public API ----------------------------------------------------------------

    async def model_info(self) -> ModelInfo:
        return await self._transport.query(ModelInfoQuery(), ModelInfo, self.timeout_s)

    async def default_sampling_params(self) -> SamplingParams:
        """What a request given no SamplingParams samples with: the model's generation_config
        defaults (model_defaults.py); SamplingParams' own until a worker has joined."""
        return default_sampling_params(await self.served_model())

    async def health(self) -> Health:
        return await self._transport.query(HealthQuery(), Health, self.timeout_s)

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
        await self._transport.send_abort(self._live.scheduler_ids(ids))

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
        # Off the event loop: a long conversation takes a while to render (bounded by the caller's input).
        text = await off_loop(functools.partial(render_chat, template, messages, info.special_tokens,
                                                add_generation_prompt=add_generation_prompt, **kwargs))
        if not tokenize:
            return text
        return (await (await self.text_codec()).encode_async([text], add_special_tokens=False))[0]

    async def stream(self, prompt: Prompt, params: SamplingParams | None = None, *, request_id: str | None = None,
                     priority: int = 0) -> AsyncIterator[StreamDelta]:
        """Yields a delta of new tokens (and text) per step until the request finishes; with
        n > 1 the deltas of the n choices interleave, told apart by `index`."""
        self._transport.start()
        params = validated(params if params is not None else await self.default_sampling_params())
        codec = await (self.text_codec() if params.stop else self._text_codec())
        queue: asyncio.Queue[tuple[int, WireOutput]] = asyncio.Queue()

        def sink_of(index: int) -> Sink:
            return functools.partial(_put_indexed, queue.put_nowait, index)

        with self._live.claimed(request_id, params, sink_of) as (request_id, choice_ids):
            prompt_ids, refusal = await self._checked_prompt(prompt, choice_ids)
            if refusal is not None:
                raise RequestError(request_id, *refusal)
        choices = [Choice(index, params, codec, incremental=True) for index in range(params.n)]
        num_open = len(choices)
        try:
            await self._transport.send_requests([GenerateRequest(choice_id, prompt_ids, choice_params(params, index), priority,
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
                        self._transport.abort_soon([choice_ids[index]])
                text = choice.text.take_delta(choice.finished) if choice.text is not None else None
                yield StreamDelta(request_id, new_ids, text, choice.finish_reason, output.num_prompt_tokens,
                                  new_logprobs, index, choice.stop_reason, output.prompt_logprobs)
        finally:
            self._live.forget(request_id, choice_ids)
            unfinished = [choice_ids[c.index] for c in choices if not c.finished]
            if unfinished:  # the caller stopped listening (or one choice failed): free the rest
                self._transport.abort_soon(unfinished)

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
        if params is None:
            params = await self.default_sampling_params()
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
        PoolingParams instead of SamplingParams make pooling requests (see generate_iter_items).
        Closing the iterator early aborts what is in flight.
        """
        if window is None:
            window = min(len(prompts), SMALL_BATCH) if hasattr(prompts, "__len__") else SMALL_BATCH
        items = prompt_items(prompts, per_prompt(params, (SamplingParams, PoolingParams)), per_prompt(priority, int),
                             iter(request_ids) if request_ids is not None else None)
        # Closed with this generator, so that an early end aborts what is in flight at once.
        async with contextlib.aclosing(self.generate_iter_items(
                items, window=window, progress=progress,
                total=len(prompts) if hasattr(prompts, "__len__") else None)) as outputs:
            async for index, output in outputs:
                yield index, output

    async def generate_iter_items(self, items: Iterable[tuple] | AsyncIterable[tuple], *, window: int = SMALL_BATCH,
                                  progress: bool = False, total: int | None = None
                                  ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """generate_iter for items (prompt, params, priority[, request_id]) read one at a time:
        for callers whose prompts and parameters come together (a batch file's lines). An item
        whose params are PoolingParams is a pooling request: its output is a PoolingRequestOutput."""
        self._transport.start()
        items = aiter_of(items)
        # The tokenizer that decodes the outputs is asked for alongside the requests, not after
        # them: by then a killed scheduler could not answer, and the batch would be lost whole.
        tokenizer_asked = None if self._model_info is not None else self._ask_soon(self._text_codec())
        collector = BatchCollector(total, progress, on_stop_string=self._transport.abort_soon)
        run = _BatchRun(items, window, collector, tokenizer_asked)
        try:
            while True:
                while collector.ready:
                    yield await self._hand_over_ready(run)
                await self._fill_window(run)
                if run.exhausted and not run.live:
                    return
                if not collector.ready:
                    await collector.wait_for_change()
        finally:
            self._end_batch_run(run)

    async def _hand_over_ready(self, run: _BatchRun) -> tuple[int, RequestOutput]:
        """The first prompt whose choices have all ended, its claim released."""
        self._transport.raise_if_refused()
        entry = run.collector.ready.popleft()
        if not run.codec_ready and any(c.token_ids for c in entry.choices):
            await self._codec_for_outputs(run.tokenizer_asked)
            run.codec_ready = True
        del run.live[entry.index]
        self._live.forget(entry.request_id, entry.choice_ids)
        return entry.index, self._request_output(entry)

    async def _fill_window(self, run: _BatchRun) -> None:
        """Reads items while the window has room, and sends their requests in one message."""
        requests: list[GenerateRequest] = []
        while not run.exhausted and run.has_room:
            item = await anext(run.items, None)
            if item is None:
                run.exhausted = True
                break
            prompt, params, priority, *request_id = item
            params = await self._validated_once(run, params)
            pooling, params = (params, POOLING_SAMPLING) if isinstance(params, PoolingParams) else (None, params)
            requests += await self._add_prompt(run, prompt, params, priority, request_id[0] if request_id else None,
                                               pooling)
        if requests:
            await self._transport.send_requests(requests)

    async def _validated_once(self, run: _BatchRun, params: SamplingParams | PoolingParams | None
                              ) -> SamplingParams | PoolingParams:
        """params validated (None: the model's defaults), once for a run of prompts given the same object."""
        if params is not run.given_params or run.checked_params is None:
            if isinstance(params, PoolingParams):
                checked = validated_pooling(params)
            else:
                checked = validated(params if params is not None else await self.default_sampling_params())
            run.given_params, run.checked_params = params, checked
        return run.checked_params

    async def _add_prompt(self, run: _BatchRun, prompt: Prompt, params: SamplingParams, priority: int,
                           request_id: str | None, pooling: PoolingParams | None = None) -> list[GenerateRequest]:
        """Puts the prompt in flight in the run (see _prompt_in_flight); returns its requests to
        send: none when it was refused here (it fails alone, now, as the scheduler would fail it)."""
        entry, refusal = await self._prompt_in_flight(run.num_read, prompt, params, request_id, run.collector,
                                                      pooling)
        run.live[entry.index] = entry
        run.num_read += 1
        if refusal is not None:
            for choice_id in entry.choice_ids:
                run.collector.on_output(error_output(choice_id, *refusal))
            return []
        return [GenerateRequest(choice_id, entry.prompt_ids, choice_params(params, c), priority,
                                stream=bool(params.stop), pooling=pooling) for c, choice_id in enumerate(entry.choice_ids)]

    def _end_batch_run(self, run: _BatchRun) -> None:
        """Aborts on the scheduler what had not finished (the caller stopped early, or a call
        failed), and releases what the run holds."""
        unfinished = run.collector.unfinished_ids()
        if unfinished:
            self._transport.abort_soon(unfinished)
        if run.tokenizer_asked is not None and not run.tokenizer_asked.done():
            run.tokenizer_asked.cancel()
        for entry in run.live.values():
            self._live.forget(entry.request_id, entry.choice_ids)
        run.collector.close()

    async def _prompt_in_flight(self, index: int, prompt: Prompt, params: SamplingParams, request_id: str | None,
                                collector: BatchCollector, pooling: PoolingParams | None = None
                                ) -> tuple[PromptInFlight, tuple | None]:
        """A prompt tokenized and its choices claimed, in the collector, ready to be sent; and
        (error code, message) when it must not be (see _checked_prompt)."""
        if params.stop:
            await self.text_codec()  # stop strings are matched on text
        with self._live.claimed(request_id, params, lambda _: collector.on_output) as (request_id, choice_ids):
            prompt_ids, refusal = await self._checked_prompt(prompt, choice_ids, pooling)
        # stop strings: see every step, to abort at a match
        choices = [Choice(c, params, self._codec, incremental=bool(params.stop)) for c in range(params.n)]
        entry = PromptInFlight(index, request_id, prompt if isinstance(prompt, str) else None, prompt_ids,
                               choice_ids, choices, pooling=pooling)
        collector.add(entry)
        return entry, refusal

    def _request_output(self, entry: PromptInFlight) -> RequestOutput | PoolingRequestOutput:
        if entry.pooling is not None:
            [choice] = entry.choices
            if choice.pooled is not None:
                return PoolingRequestOutput(entry.request_id, entry.prompt_ids, PoolingOutput(floats_of(choice.pooled)),
                                            prompt=entry.prompt)
            return PoolingRequestOutput(entry.request_id, entry.prompt_ids, None, error_code=choice.error_code or
                                        ErrorCode.INTERNAL, error_message=choice.error_message or
                                        f"the request ended ({choice.finish_reason}) without pooled values",
                                        prompt=entry.prompt)
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
        await self._transport.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
