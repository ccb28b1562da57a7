"""POST /v1/embeddings, in OpenAI's shape: texts or token ids in, one embedding each out, as
floats or as base64 of their float32 little-endian bytes (what the openai client asks for by
default and decodes with numpy)."""
import base64

import numpy as np

from gateway_svc.completions import prompt_list
from gateway_svc.errors import bad_request
from gateway_svc.ids import new_id
from gateway_svc.openai_requests import checked_request
from gateway_svc.pooling_requests import EmbeddingRequest
from gateway_svc.responses import ListEnvelope, PoolingJob, check_token_ids
from gateway_svc.upstream import Upstream
from protocol.client_messages import ModelInfo
from protocol.pooling import PoolingParams


def encoded(embedding: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(embedding, dtype="<f4").tobytes()).decode()
    return embedding


async def checked_prompts(upstream: Upstream, info: ModelInfo, given, param: str = "input") -> list[str | list[int]]:
    """A pooling endpoint's input as prompts (OpenAI's four forms, each at most the model's
    length), within the request limits; texts need the model's tokenizer."""
    prompts = prompt_list(given, info.max_model_len, room=0, param=param)
    upstream.limits.check_num_prompts(len(prompts))
    if isinstance(prompts[0], str):
        if await upstream.client.text_codec(required=False) is None:
            raise bad_request(f"the model has no tokenizer: give {param} as token ids", "no_tokenizer", param=param)
    else:
        for ids in prompts:
            check_token_ids(info, ids, param)
    return prompts


async def embedding_job(body: bytes, upstream: Upstream) -> PoolingJob:
    """The request parsed and checked (an APIError when it is refused), as the HTTP endpoint and
    a batch line (gateway_svc.batch_lines) both run it."""
    req, info = await checked_request(body, EmbeddingRequest, upstream, "/v1/embeddings", ("embed",))
    prompts = await checked_prompts(upstream, info, req.input)
    if req.dimensions is not None and not 1 <= req.dimensions <= info.pooling.size:
        raise bad_request(f"dimensions must be in [1, {info.pooling.size}] (the model's embedding size)",
                          param="dimensions")
    params = PoolingParams(task="embed", dimensions=req.dimensions, normalize=req.normalize)
    envelope = ListEnvelope(new_id("embd-"), upstream.name_of(info))

    def body(embeddings: list[list[float]], num_tokens: int) -> dict:
        data = [{"object": "embedding", "index": i, "embedding": encoded(embedding, req.encoding_format)}
                for i, embedding in enumerate(embeddings)]
        return envelope.body(data, num_tokens)

    async def answer(priority: int) -> dict:
        outputs = await upstream.client.embed(prompts, pooling_params=params, priority=priority)
        return body([o.outputs.embedding for o in outputs], sum(len(o.prompt_token_ids) for o in outputs))

    return PoolingJob(envelope.request_id, req.priority, answer, prompts, [params] * len(prompts), body)
