"""POST /v1/score and /v1/rerank (also /rerank, /v2/rerank), in vLLM's (and Cohere's) shapes:
text pairs scored by a cross-encoder (its one label's probability) or by an embedder (the
cosine of the two embeddings), as the SDK's score() computes them."""

from gateway_svc.errors import bad_request
from gateway_svc.ids import new_id
from gateway_svc.openai_requests import checked_request
from gateway_svc.pooling_requests import RerankRequest, ScoreRequest
from gateway_svc.responses import ListEnvelope, PoolingJob
from gateway_svc.upstream import Upstream
from protocol.client_messages import ModelInfo

SCORING_TASKS = ("embed", "classify")


def _require_one_label(info: ModelInfo, endpoint: str) -> None:
    if info.pooling.task == "classify" and info.pooling.size != 1:
        raise bad_request(f"{endpoint} needs a cross-encoder with one label; this classifier has "
                          f"{info.pooling.size}: use /v1/classify", "wrong_model_task", param="model")


def _num_texts(texts: str | list[str]) -> int:
    return 1 if isinstance(texts, str) else len(texts)


async def score_job(body: bytes, upstream: Upstream) -> PoolingJob:
    """The request parsed and checked (an APIError when it is refused), as the HTTP endpoint and
    a batch line both run it; the pairing rule (one text_1 against each text_2, or pairwise) is
    the SDK's."""
    req, info = await checked_request(body, ScoreRequest, upstream, "/v1/score", SCORING_TASKS)
    _require_one_label(info, "/v1/score")
    upstream.limits.check_num_prompts(max(_num_texts(req.text_1), _num_texts(req.text_2)))
    envelope = ListEnvelope(new_id("score-"), upstream.name_of(info))

    async def answer(priority: int) -> dict:
        outputs = await upstream.client.score(req.text_1, req.text_2, priority=priority)
        num_tokens = sum(len(o.prompt_token_ids) for o in outputs)
        data = [{"index": i, "object": "score", "score": o.outputs.score} for i, o in enumerate(outputs)]
        return envelope.body(data, num_tokens)

    return PoolingJob(envelope.request_id, req.priority, answer)


async def rerank_job(body: bytes, upstream: Upstream) -> PoolingJob:
    """The query scored against each document, the results by relevance (the best first), the
    first top_n of them (0: all)."""
    req, info = await checked_request(body, RerankRequest, upstream, "/v1/rerank", SCORING_TASKS)
    _require_one_label(info, "/v1/rerank")
    if not req.documents:
        raise bad_request("documents must not be empty", param="documents")
    if req.top_n < 0:
        raise bad_request("top_n must be 0 (every document) or more", param="top_n")
    upstream.limits.check_num_prompts(len(req.documents))
    request_id, model_name = new_id("rerank-"), upstream.name_of(info)

    async def answer(priority: int) -> dict:
        outputs = await upstream.client.score(req.query, req.documents, priority=priority)
        scores = [o.outputs.score for o in outputs]
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])  # stable: ties keep the documents' order
        results = [{"index": i, "document": {"text": req.documents[i]}, "relevance_score": scores[i]}
                   for i in ranked[:req.top_n or len(ranked)]]
        return {"id": request_id, "model": model_name,
                "usage": {"total_tokens": sum(len(o.prompt_token_ids) for o in outputs)}, "results": results}

    return PoolingJob(request_id, req.priority, answer)
