"""The FastAPI application: routes (generation: completions, chat; pooling: embeddings, score,
rerank, classify), the API key, /health, /v1/models and /metrics (the Batch API's routes:
batch_api)."""
import hmac
import time

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from gateway_svc.batch_api import add_batch_routes
from gateway_svc.batch_store import BatchStore
from gateway_svc.body_limit import BodyLimit
from gateway_svc.chat import chat_completion_job
from gateway_svc.classify import classify_job
from gateway_svc.completions import completion_job
from gateway_svc.disconnects import CountDisconnects
from gateway_svc.embeddings import embedding_job
from gateway_svc.errors import APIError, from_sdk_error, install_error_handlers, unavailable
from gateway_svc.pooling_requests import task_of
from gateway_svc.responses import json_response, serve_endpoint, serve_pooling
from gateway_svc.scores import rerank_job, score_job
from gateway_svc.upstream import Upstream
from protocol.metrics import CONTENT_TYPE


async def _as_api_errors(endpoint):
    """Every failure as an OpenAI-shaped error here: an exception left to Starlette's catch-all
    handler is re-raised after the response, and the connection dies with it."""
    try:
        return await endpoint
    except (APIError, ClientDisconnect):
        raise
    except Exception as e:
        raise from_sdk_error(e) from None


def create_app(upstream: Upstream, api_key: str | None = None, batch_store: BatchStore | None = None) -> FastAPI:
    """batch_store: serve OpenAI's Batch API (/v1/files, /v1/batches) from it."""
    app = FastAPI(title="stepserve gateway", summary="OpenAI-compatible API over a stepserve scheduler")
    install_error_handlers(app)
    # Around every route (the last added runs first): the body bound, then quiet disconnects.
    app.add_middleware(CountDisconnects, disconnects=upstream.disconnects)
    app.add_middleware(BodyLimit, limits=upstream.limits)
    started = int(time.time())

    async def require_key(request: Request) -> None:
        """Bearer key on /v1/*, compared in constant time; /health and /metrics are open, as in vLLM."""
        if not api_key:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), api_key.encode()):
            raise APIError(401, "Missing or incorrect API key: send 'Authorization: Bearer KEY'.", "invalid_api_key",
                           type="authentication_error")

    keyed = [Depends(require_key)]
    if batch_store is not None:
        add_batch_routes(app, batch_store, keyed)

    @app.post("/v1/completions", dependencies=keyed)
    async def completions(request: Request):
        return await _as_api_errors(serve_endpoint(request, upstream, completion_job))

    @app.post("/v1/chat/completions", dependencies=keyed)
    async def chat_completions(request: Request):
        return await _as_api_errors(serve_endpoint(request, upstream, chat_completion_job))

    @app.post("/v1/embeddings", dependencies=keyed)
    async def embeddings(request: Request):
        return await _as_api_errors(serve_pooling(request, upstream, embedding_job))

    @app.post("/v1/score", dependencies=keyed)
    async def score(request: Request):
        return await _as_api_errors(serve_pooling(request, upstream, score_job))

    @app.post("/v1/classify", dependencies=keyed)
    async def classify(request: Request):
        return await _as_api_errors(serve_pooling(request, upstream, classify_job))

    async def rerank(request: Request):
        return await _as_api_errors(serve_pooling(request, upstream, rerank_job))

    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):  # vLLM serves Cohere's paths too
        app.add_api_route(path, rerank, methods=["POST"], dependencies=keyed)

    @app.get("/v1/models", dependencies=keyed)
    async def models():
        info = await upstream.client.served_model()
        if info.model is None and upstream.served_model_name is None:
            raise unavailable("no worker has joined the scheduler yet, so the model is not known", "no_worker")
        card = {"id": upstream.served_model_name or info.model, "object": "model", "created": started,
                "owned_by": "stepserve", "root": info.model, "max_model_len": info.max_model_len or None,
                "vocab_size": info.vocab_size or None,  # stepserve's extras: benchmarks draw token ids,
                "task": task_of(info)}  # and what the model does: generate, embed or classify
        return json_response({"object": "list", "data": [card]})

    @app.get("/health")
    async def health():
        """200 while at least one worker is joined and answering, 503 otherwise (or when the
        scheduler is silent). A worker silent past --worker-timeout is dropped, and counted in
        unhealthy_replicas until it rejoins (docs/operations.md)."""
        try:
            h = await upstream.health(max_age_s=0.0)
        except Exception as e:
            return from_sdk_error(e).response()
        body = {"status": "ok" if h.num_workers else "no_worker", "num_workers": h.num_workers,
                "num_running": h.num_running, "num_waiting": h.num_waiting,
                "unhealthy_replicas": h.unhealthy_replicas}
        return Response(json_response(body).body, status_code=200 if h.num_workers else 503,
                        media_type="application/json")

    @app.get("/metrics")
    async def metrics():
        try:
            await upstream.health(max_age_s=0.0)  # the queue gauges as of now
        except Exception:
            pass  # the counters still render; the gauges keep their last values
        return Response(upstream.metrics.render(), media_type=CONTENT_TYPE)

    return app
