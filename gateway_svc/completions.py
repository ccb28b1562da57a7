"""POST /v1/completions: prompts as text, token ids, or lists of either; n choices each."""
import msgspec

from client_sdk.tokenizer import TextCodec
from gateway_svc.errors import bad_request
from gateway_svc.choices import GatheredChoice
from gateway_svc.ids import new_id
from gateway_svc.logprobs import completion_logprobs, echo_logprobs
from gateway_svc.openai_requests import CompletionRequest, checked_request, sampling_params
from gateway_svc.responses import Formatter, Job, check_token_ids, max_tokens_for
from gateway_svc.upstream import Upstream


def _token_ids(prompt: list, max_len: int, room: int, param: str) -> bool:
    """Whether prompt is a list of token ids; refused as too long (before its ids are looked at,
    which takes a while for millions) when it leaves fewer than `room` of max_len's positions."""
    if not prompt or not isinstance(prompt[0], int):
        return False
    if len(prompt) > max_len - room:
        reason = "which leaves no room to generate" if room else "more than that"
        raise bad_request(f"This model's maximum context length is {max_len} tokens; a prompt has {len(prompt)}, "
                          f"{reason}.", "prompt_too_long", param=param)
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)


def prompt_list(prompt, max_len: int, room: int = 1, param: str = "prompt") -> list[str | list[int]]:
    """OpenAI's four prompt forms -> a list of prompts, each text or token ids (at most
    max_len - room of them: room 1 to generate, 0 for a pooling model). param: the field's name."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if _token_ids(prompt, max_len, room, param):
        return [list(prompt)]
    if prompt and all(isinstance(p, list) and _token_ids(p, max_len, room, param) for p in prompt):
        return [list(p) for p in prompt]
    raise bad_request(f"{param} must be a string, a list of strings, a list of token ids or a list of lists of "
                      "token ids, and not empty", param=param)


class CompletionFormatter(Formatter):
    def __init__(self, req: CompletionRequest, codec: TextCodec | None, prompt_texts: list[str] = ()):
        self.req, self.codec = req, codec
        self._text_offsets: dict[int, int] = {}  # per streamed choice: where its next token's text starts
        self.prompt_texts = list(prompt_texts)  # echo: each prompt's text, as given or decoded
        # max_tokens 0 with echo scores the prompt: one token is computed (the prompt's last
        # position must be sampled to end the request) and dropped here.
        self.score_only = req.echo and req.max_tokens == 0

    def _choice(self, job: Job, index: int, text: str, token_ids, logprobs, finish_reason, stop_reason,
                with_prompt_ids: bool) -> dict:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}
        if self.req.logprobs is not None and logprobs:
            offset = self._text_offsets.get(index, 0)
            choice["logprobs"] = completion_logprobs(self.codec, logprobs, offset)
            self._text_offsets[index] = offset + sum(map(len, choice["logprobs"]["tokens"]))
        if self.req.return_token_ids:  # vLLM's extra
            choice["token_ids"] = token_ids
            if with_prompt_ids:
                choice["prompt_token_ids"] = job.prompts[index // job.params[0].n]
        return choice

    def _envelope(self, job: Job, choices: list[dict]) -> dict:
        return {"id": job.request_id, "object": "text_completion", "created": job.created, "model": job.model_name,
                "choices": choices}

    def chunk(self, job: Job, index: int, delta) -> dict | None:
        if not delta.token_ids and not delta.text and delta.finish_reason is None:
            return None
        first = index not in self._text_offsets
        self._text_offsets.setdefault(index, 0)
        return self._envelope(job, [self._choice(job, index, delta.text or "", delta.token_ids, delta.logprobs,
                                                 delta.finish_reason, delta.stop_reason, first)])

    def usage_chunk(self, job: Job, usage: dict) -> dict:
        return {**self._envelope(job, []), "usage": usage}

    def body(self, job: Job, choices, usage: dict) -> dict:
        if self.score_only:
            choices = [GatheredChoice(finish_reason="length", prompt_logprobs=c.prompt_logprobs) for c in choices]
            usage = job.usage(0)
        formatted = [self._choice(job, i, c.text, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason, True)
                     for i, c in enumerate(choices)]
        if self.req.echo:
            for i, (choice, gathered) in enumerate(zip(formatted, choices)):
                self._echo(choice, job.prompts[i // job.params[0].n], self.prompt_texts[i // job.params[0].n],
                           gathered.prompt_logprobs)
        return {**self._envelope(job, formatted), "usage": usage}

    def _echo(self, choice: dict, prompt_ids: list[int], prompt_text: str, prompt_logprobs) -> None:
        """The prompt's text first and, with logprobs, its tokens' logprobs first (OpenAI's echo)."""
        choice["text"] = prompt_text + choice["text"]
        if self.req.logprobs is None:
            return
        echoed = echo_logprobs(self.codec, prompt_ids, prompt_logprobs)
        generated = choice["logprobs"]
        if generated is not None:
            shift = len(prompt_text)
            generated["text_offset"] = [offset + shift for offset in generated["text_offset"]]
            echoed = {key: echoed[key] + generated[key] for key in echoed}
        choice["logprobs"] = echoed


async def completion_job(body: bytes, upstream: Upstream) -> tuple[Job, CompletionFormatter]:
    """The request parsed and checked (an APIError when it is refused), as the HTTP endpoint and
    a batch line (gateway_svc.batch_lines) both run it."""
    req, info = await checked_request(body, CompletionRequest, upstream, "/v1/completions")
    prompts = prompt_list(req.prompt, info.max_model_len)
    upstream.limits.check_num_prompts(len(prompts))
    codec = await upstream.client.text_codec(required=False)
    texts = [p for p in prompts if isinstance(p, str)]
    if codec is None and texts:
        raise bad_request("the model has no tokenizer: give the prompt as token ids", "no_tokenizer")
    # Off the event loop when long, and a text too long to fit is refused untokenized (PromptTooLong).
    encoded = iter(await codec.encode_async(texts) if texts else ())
    ids = [next(encoded) if isinstance(p, str) else p for p in prompts]
    for prompt_ids in ids:
        check_token_ids(info, prompt_ids)
    prompt_logprobs = req.logprobs if req.echo else None
    max_tokens = req.max_tokens if req.max_tokens is not msgspec.UNSET else info.sampling_defaults.max_tokens or 16
    if req.echo and max_tokens == 0:
        max_tokens = 1  # scoring: CompletionFormatter
    params = [sampling_params(req, max_tokens_for(info, len(p), max_tokens), req.logprobs, prompt_logprobs,
                              info=info)
              for p in ids]
    if params[0].stop and codec is None:
        raise bad_request("stop strings need the model's tokenizer", "no_tokenizer", param="stop")
    job = Job(new_id("cmpl-"), upstream.name_of(info), ids, params, req.stream,
              bool(req.stream_options and req.stream_options.include_usage), req.priority)
    prompt_texts = [p if isinstance(p, str) else codec.decode(p) for p in prompts] if req.echo and codec else []
    if req.echo and codec is None:
        raise bad_request("echo needs the model's tokenizer", "no_tokenizer", param="echo")
    return job, CompletionFormatter(req, codec, prompt_texts)
