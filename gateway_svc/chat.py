"""POST /v1/chat/completions: messages (and tools) rendered with the model's chat template, n
choices, each output parsed into reasoning, content and tool calls (chat_output.py)."""
import msgspec

from client_sdk.tokenizer import TextCodec
from gateway_svc.chat_output import ChoiceOutput
from gateway_svc.chat_parsing import ChatParsing
from gateway_svc.errors import bad_request
from gateway_svc.ids import new_id
from gateway_svc.logprobs import chat_logprobs
from gateway_svc.openai_requests import ChatCompletionRequest, checked_request, sampling_params
from gateway_svc.reasoning_parsers import REASONING_PARSERS, THINK_END
from gateway_svc.request_limits import check_depth
from gateway_svc.responses import Formatter, Job, check_token_ids, max_tokens_for
from gateway_svc.tool_choice import ToolChoice, tool_choice_of
from gateway_svc.upstream import Upstream
from protocol.sampling import MAX_LOGPROBS


class ChatFormatter(Formatter):
    def __init__(self, req: ChatCompletionRequest, codec: TextCodec, tool_choice: ToolChoice, parsing: ChatParsing):
        self.req, self.codec = req, codec
        self._tool_choice, self._parsing = tool_choice, parsing
        self._streamed: dict[int, ChoiceOutput] = {}  # each streamed choice's parsers, by index

    def _output(self) -> ChoiceOutput:
        return ChoiceOutput(self._parsing, self._tool_choice, self.req.chat_template_kwargs)

    def _logprobs(self, steps) -> dict | None:
        return chat_logprobs(self.codec, steps) if self.req.logprobs and steps else None

    def _envelope(self, job: Job, choices: list[dict], obj: str = "chat.completion.chunk") -> dict:
        return {"id": job.request_id, "object": obj, "created": job.created, "model": job.model_name,
                "system_fingerprint": None, "choices": choices}

    def opening_chunks(self, job: Job) -> list[dict]:
        """OpenAI opens each streamed choice with the role."""
        return [self._envelope(job, [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}]) for i in range(job.num_choices)]

    def chunk(self, job: Job, index: int, delta) -> dict | None:
        if not delta.token_ids and not delta.text and delta.finish_reason is None:
            return None
        output = self._streamed.get(index) or self._streamed.setdefault(index, self._output())
        choice = {"index": index, "delta": output.delta(delta.text or "", final=delta.finish_reason is not None),
                  "logprobs": self._logprobs(delta.logprobs), "finish_reason": output.finish_reason(delta.finish_reason),
                  "stop_reason": delta.stop_reason}
        if self.req.return_token_ids:
            choice["token_ids"] = delta.token_ids
        return self._envelope(job, [choice])

    def usage_chunk(self, job: Job, usage: dict) -> dict:
        return {**self._envelope(job, []), "usage": usage}

    def body(self, job: Job, choices, usage: dict) -> dict:
        out = []
        for i, c in enumerate(choices):
            output = self._output()
            choice = {"index": i, "message": output.message(c.text or ""), "logprobs": self._logprobs(c.logprobs),
                      "finish_reason": output.finish_reason(c.finish_reason), "stop_reason": c.stop_reason}
            if self.req.return_token_ids:
                choice["token_ids"] = c.token_ids
            out.append(choice)
        body = {**self._envelope(job, out, "chat.completion"), "usage": usage}
        if self.req.return_token_ids:
            body["prompt_token_ids"] = job.prompts[0]
        return body


def _starts_in_reasoning(parsing: ChatParsing, req: ChatCompletionRequest) -> bool:
    if parsing.reasoning_parser is None:
        return False
    return REASONING_PARSERS[parsing.reasoning_parser](chat_template_kwargs=req.chat_template_kwargs).starts_in_reasoning


async def chat_completion_job(body: bytes, upstream: Upstream) -> tuple[Job, ChatFormatter]:
    """The request parsed and checked (an APIError when it is refused), as the HTTP endpoint and
    a batch line (gateway_svc.batch_lines) both run it."""
    req, info = await checked_request(body, ChatCompletionRequest, upstream, "/v1/chat/completions")
    if not req.messages:
        raise bad_request("messages must not be empty", param="messages")
    check_depth(req.messages, "messages")
    check_depth(req.chat_template_kwargs, "chat_template_kwargs")
    check_depth(req.tools, "tools")
    tool_choice = tool_choice_of(req.tools, req.tool_choice, req.parallel_tool_calls,
                                 upstream.chat_parsing.enable_auto_tool_choice)
    if info.chat_template is None and req.chat_template is None:
        raise bad_request(f"the model {upstream.name_of(info)!r} has no chat template (no chat_template in its "
                          "tokenizer_config.json, no chat_template.jinja), so chat completions are not available; "
                          "use /v1/completions", "no_chat_template", param="messages")
    codec = await upstream.client.text_codec(required=False)
    if codec is None:
        raise bad_request("the model has no tokenizer, so chat completions are not available", "no_tokenizer")
    ids = await upstream.client.apply_chat_template(req.messages, add_generation_prompt=req.add_generation_prompt,
                                                    chat_template=req.chat_template, tools=req.tools,
                                                    **(req.chat_template_kwargs or {}))
    check_token_ids(info, ids)
    num_logprobs = None
    if req.logprobs:
        num_logprobs = req.top_logprobs or 0
        if not 0 <= num_logprobs <= MAX_LOGPROBS:
            raise bad_request(f"top_logprobs must be in [0, {MAX_LOGPROBS}]", param="top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = sampling_params(req, max_tokens_for(info, len(ids), max_tokens), num_logprobs, info=info,
                             forced_structured_outputs=tool_choice.structured_outputs())
    if params.structured_outputs is not None and _starts_in_reasoning(upstream.chat_parsing, req):
        # The grammar is the answer's: it holds after the reasoning span, as vLLM applies it.
        after = codec.encode(THINK_END, add_special_tokens=False)
        params = msgspec.structs.replace(params, structured_outputs=msgspec.structs.replace(
            params.structured_outputs, after_token_ids=after))
    job = Job(new_id("chatcmpl-"), upstream.name_of(info), [ids], [params], req.stream,
              bool(req.stream_options and req.stream_options.include_usage), req.priority)
    return job, ChatFormatter(req, codec, tool_choice, upstream.chat_parsing)
