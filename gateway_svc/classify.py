"""POST /v1/classify, in vLLM's shape: each input's probabilities over the model's labels (its
id2label) and the most likely label."""
from gateway_svc.embeddings import checked_prompts
from gateway_svc.ids import new_id
from gateway_svc.openai_requests import checked_request
from gateway_svc.pooling_requests import ClassificationRequest
from gateway_svc.responses import ListEnvelope, PoolingJob
from gateway_svc.upstream import Upstream
from protocol.pooling import PoolingParams


async def classify_job(body: bytes, upstream: Upstream) -> PoolingJob:
    """The request parsed and checked (an APIError when it is refused), as the HTTP endpoint and
    a batch line both run it."""
    req, info = await checked_request(body, ClassificationRequest, upstream, "/v1/classify", ("classify",))
    prompts = await checked_prompts(upstream, info, req.input)
    params = PoolingParams(task="classify", activation=req.activation)
    labels = info.pooling.labels
    envelope = ListEnvelope(new_id("classify-"), upstream.name_of(info))

    def body(values: list[list[float]], num_tokens: int) -> dict:
        data = []
        for i, probs in enumerate(values):
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append({"index": i, "label": labels[best] if best < len(labels) else str(best), "probs": probs,
                         "num_classes": len(probs)})
        return envelope.body(data, num_tokens)

    async def answer(priority: int) -> dict:
        outputs = await upstream.client.classify(prompts, pooling_params=params, priority=priority)
        return body([o.outputs.probs for o in outputs], sum(len(o.prompt_token_ids) for o in outputs))

    return PoolingJob(envelope.request_id, req.priority, answer, prompts, [params] * len(prompts), body)
