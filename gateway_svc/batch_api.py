"""OpenAI's Batch API routes: /v1/files (upload, list, retrieve, content, delete) and
/v1/batches (create, retrieve, list, cancel), in OpenAI's shapes, over the BatchStore; the work
itself is BatchJobs'. The routes are added to the app like the others, behind the same API key
and the same middleware. A write that finds the disk full is answered 507 naming the path,
and leaves nothing half written."""
import asyncio
import contextlib
import os
import shutil

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse

from gateway_svc.batch_lines import ENDPOINTS
from gateway_svc.batch_store import COMPLETION_WINDOW_S, TERMINAL, BatchStore
from gateway_svc.disk_full import DiskFull, disk_full_named
from gateway_svc.errors import APIError, bad_request
from gateway_svc.ids import new_id
from gateway_svc.openai_requests import decode_body
from gateway_svc.responses import json_response


class CreateBatch(msgspec.Struct, kw_only=True):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None


def _not_found(kind: str, object_id: str) -> APIError:
    return APIError(404, f"No such {kind}: {object_id!r}", "not_found", param="id")


def _existing(kind: str, object_id: str, obj: dict | None) -> dict:
    if obj is None:
        raise _not_found(kind, object_id)
    return obj


def _insufficient_storage(e: DiskFull) -> APIError:
    return APIError(507, f"{e}: nothing was kept; try again once there is space", "insufficient_storage",
                    type="server_error")


def _page(data: list[dict], has_more: bool) -> dict:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def add_batch_routes(app: FastAPI, store: BatchStore, dependencies: list) -> None:
    @app.post("/v1/files", dependencies=dependencies)
    async def upload_file(request: Request):
        form = await request.form()
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "batch":
            raise bad_request(f"purpose must be 'batch' (this server keeps batch input files), got {purpose!r}",
                              param="purpose")
        if upload is None or isinstance(upload, str):
            raise bad_request("a file is required, as the multipart field 'file'", param="file")
        file_id = new_id("file-")

        def save() -> None:  # a large upload is spooled to disk by Starlette: copy it off the loop
            with open(store.file_path(file_id), "wb") as f:
                shutil.copyfileobj(upload.file, f, 1 << 20)

        try:
            with disk_full_named(store.file_path(file_id)):
                await asyncio.to_thread(save)
            return json_response(store.add_file(file_id, upload.filename or "upload.jsonl", purpose))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(store.file_path(file_id))
            raise
        finally:
            await form.close()

    @app.exception_handler(DiskFull)
    async def _disk_full(request: Request, e: DiskFull):
        return _insufficient_storage(e).response()

    @app.get("/v1/files", dependencies=dependencies)
    async def list_files(purpose: str | None = None, limit: int = 10000, after: str | None = None):
        files = store.files(purpose, limit + 1, after)
        return json_response(_page(files[:limit], len(files) > limit))

    @app.get("/v1/files/{file_id}", dependencies=dependencies)
    async def retrieve_file(file_id: str):
        return json_response(_existing("file", file_id, store.file(file_id)))

    @app.get("/v1/files/{file_id}/content", dependencies=dependencies)
    async def file_content(file_id: str):
        _existing("file", file_id, store.file(file_id))
        return FileResponse(store.file_path(file_id), media_type="application/octet-stream")

    @app.delete("/v1/files/{file_id}", dependencies=dependencies)
    async def delete_file(file_id: str):
        if not store.delete_file(file_id):
            raise _not_found("file", file_id)
        return json_response({"id": file_id, "object": "file", "deleted": True})

    @app.post("/v1/batches", dependencies=dependencies)
    async def create_batch(request: Request):
        req = decode_body(await request.body(), CreateBatch)
        if req.endpoint not in ENDPOINTS:
            raise bad_request(f"endpoint must be one of {sorted(ENDPOINTS)}", param="endpoint")
        if req.completion_window not in COMPLETION_WINDOW_S:
            raise bad_request(f"completion_window must be one of {sorted(COMPLETION_WINDOW_S)}",
                              param="completion_window")
        file = _existing("file", req.input_file_id, store.file(req.input_file_id))
        if file["purpose"] != "batch":
            raise bad_request("the input file's purpose must be 'batch'", param="input_file_id")
        return json_response(store.add_batch(req.input_file_id, req.endpoint, req.completion_window, req.metadata))

    @app.get("/v1/batches/{batch_id}", dependencies=dependencies)
    async def retrieve_batch(batch_id: str):
        return json_response(_existing("batch", batch_id, store.batch(batch_id)))

    @app.get("/v1/batches", dependencies=dependencies)
    async def list_batches(limit: int = 20, after: str | None = None):
        batches = store.batches(limit + 1, after)
        return json_response(_page(batches[:limit], len(batches) > limit))

    @app.post("/v1/batches/{batch_id}/cancel", dependencies=dependencies)
    async def cancel_batch(batch_id: str):
        batch = _existing("batch", batch_id, store.batch(batch_id))
        if batch["status"] in TERMINAL:
            raise APIError(409, f"the batch is {batch['status']}: it cannot be cancelled", "batch_not_cancellable")
        store.set_status(batch_id, "cancelling", only_from=("validating", "in_progress"))
        return json_response(store.batch(batch_id))
