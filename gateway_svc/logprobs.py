"""Logprobs in OpenAI's two shapes, from the SDK's per-token TokenLogprobs.

Completions: {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"},
where each top_logprobs entry holds the sampled token and the top N (as vLLM's).
Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
"""
from client_sdk.tokenizer import TextCodec
from protocol.client_messages import TokenLogprobs


def _texts(codec: TextCodec, steps: list[TokenLogprobs]) -> dict[int, str]:
    ids = sorted({t for s in steps for t in (s.token_id, *s.top_token_ids)})
    return dict(zip(ids, codec.decode_each(ids)))


def completion_logprobs(codec: TextCodec, steps: list[TokenLogprobs], text_offset: int = 0) -> dict:
    text = _texts(codec, steps)
    tokens, offsets = [], []
    for s in steps:
        offsets.append(text_offset)
        tokens.append(text[s.token_id])
        text_offset += len(text[s.token_id])
    return {"tokens": tokens, "token_logprobs": [s.logprob for s in steps],
            "top_logprobs": [{text[s.token_id]: s.logprob,
                              **{text[t]: lp for t, lp in zip(s.top_token_ids, s.top_logprobs)}} for s in steps],
            "text_offset": offsets}


def echo_logprobs(codec: TextCodec, prompt_ids: list[int], entries: list[TokenLogprobs] | None) -> dict:
    """The prompt's part of completions logprobs (echo): null for the first token, as OpenAI's."""
    first = codec.decode_each(prompt_ids[:1])[0]
    scored = completion_logprobs(codec, entries or [], len(first))
    return {"tokens": [first, *scored["tokens"]], "token_logprobs": [None, *scored["token_logprobs"]],
            "top_logprobs": [None, *scored["top_logprobs"]], "text_offset": [0, *scored["text_offset"]]}


def chat_logprobs(codec: TextCodec, steps: list[TokenLogprobs]) -> dict:
    text = _texts(codec, steps)

    def entry(token_id: int, logprob: float) -> dict:
        return {"token": text[token_id], "logprob": logprob, "bytes": list(text[token_id].encode())}

    return {"content": [{**entry(s.token_id, s.logprob),
                         "top_logprobs": [entry(t, lp) for t, lp in zip(s.top_token_ids, s.top_logprobs)]}
                        for s in steps]}
