"""BatchJobs: runs the Batch API's batches on this gateway, through the same engine as
`stepserve run-batch` (batch_runner.BatchRunner), and takes up, after a restart, every batch
that a gateway left unfinished.

Each batch's output lines are appended, flushed, to its record (work/<id>/output.jsonl): the
record is what was done, so a gateway killed mid-batch loses only what was in flight, and the
next one to take the batch resumes it the way `run-batch --resume` does (nothing run twice,
nothing lost). A batch is taken by holding the flock of work/<id>/lock, so of several gateways
sharing one --batch-dir (on a local filesystem) exactly one runs it; the lock dies with its
process. When the record is complete it is split into the output file (answered requests) and
the error file (error lines), as OpenAI's batches have them. Cancel aborts what is in flight
and keeps what finished. A gateway runs up to MAX_RUNNING_BATCHES batches at once, each with its
own window of requests in flight; their requests are at BATCH_PRIORITY at least, so interactive
requests go first under the priority policy.

A disk that fills under the batch ends it `failed` with a disk_full error naming the path: its
record keeps its whole lines (batch_files cuts a torn one back), the store its state (the
store's reserve gives room to record the failure), and a batch created once there is space
again runs as any other.
"""
import asyncio
import contextlib
import fcntl
import logging
import os
import time

import msgspec

from gateway_svc.batch_files import OutputFile, read_finished, read_lines
from gateway_svc.batch_runner import BatchCounts, BatchRunner
from gateway_svc.batch_store import BatchStore
from gateway_svc.disk_full import DiskFull, as_disk_full, disk_full_named
from gateway_svc.upstream import Upstream
from protocol.client_messages import BATCH_PRIORITY
from protocol.metrics import BatchMetrics

logger = logging.getLogger("stepserve.batch")
POLL_S = 0.5  # how often unowned batches are looked for, and a running one's counts and cancel are checked
# Batches one gateway runs side by side: a small batch created after a large one need not wait
# for it to end, while the requests in flight stay bounded (this many windows).
MAX_RUNNING_BATCHES = 4


class BatchJobs:
    def __init__(self, store: BatchStore, upstream: Upstream, window: int):
        self.store = store
        self.upstream = upstream
        self.window = window
        self.metrics = BatchMetrics(upstream.metrics.registry, store.num_batches_by_status)
        self._running: dict[str, asyncio.Task] = {}  # the batches this gateway runs, by id

    async def run_forever(self) -> None:
        try:
            while True:
                for batch_id in [b for b, task in self._running.items() if task.done()]:
                    del self._running[batch_id]
                for batch_id in self.store.active_batch_ids():
                    if len(self._running) >= MAX_RUNNING_BATCHES:
                        break
                    if batch_id in self._running:
                        continue
                    lock = _try_lock(os.path.join(self.store.work_dir(batch_id), "lock"))
                    if lock is not None:
                        self._running[batch_id] = asyncio.ensure_future(self._take(batch_id, lock))
                await asyncio.sleep(POLL_S)
        finally:
            for task in self._running.values():
                task.cancel()
            for task in self._running.values():
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _take(self, batch_id: str, lock: int) -> None:
        try:
            self.store.keep_reserve()  # given up by a full disk before: taken again while there is room
            await self._advance(batch_id)
        except asyncio.CancelledError:
            raise  # this gateway is stopping: the batch stays as it is, for the next one
        except Exception as e:
            await self._fail(batch_id, e)
        finally:
            os.close(lock)  # the flock goes with it

    async def _fail(self, batch_id: str, e: Exception) -> None:
        full = as_disk_full(e, self.store.batch_dir)
        if full is None:
            logger.exception("batch %s failed", batch_id, exc_info=e)
            errors = _errors("internal_error", f"{type(e).__name__}: {e}")
        else:
            logger.error("batch %s failed: %s", batch_id, full)
            errors = _errors("disk_full", f"{full}: create the batch again once there is space")
            self.store.release_reserve()
        while True:
            try:
                self.store.set_status(batch_id, "failed", errors=errors)
                return
            except DiskFull as no_room:  # no reserve left (another batch took it): recorded once there is room
                logger.warning("batch %s: its failure waits for room to be recorded: %s", batch_id, no_room)
                await asyncio.sleep(POLL_S)

    async def _advance(self, batch_id: str) -> None:
        """Moves the batch from wherever it stopped to a final status."""
        batch = self.store.batch(batch_id)
        status = batch["status"]
        if status in ("validating", "in_progress") and time.time() > batch["expires_at"]:
            status = "expired"
        elif status == "validating":
            status = self._validate(batch)
        if status == "in_progress":
            await self._worker_joined()
            status = await self._run(batch)
        if status in ("finalizing", "cancelling", "expired"):
            final = {"finalizing": "completed", "cancelling": "cancelled", "expired": "expired"}[status]
            self._finalize(batch_id, final)

    async def _worker_joined(self) -> None:
        """Waits for a worker: without one every line would be answered 503 and the batch lost."""
        while True:
            with contextlib.suppress(Exception):  # a scheduler not answering yet: ask again
                if (await self.upstream.health(max_age_s=0.0)).num_workers:
                    return
            await asyncio.sleep(POLL_S)

    def _validate(self, batch: dict) -> str:
        path = self.store.file_path(batch["input_file_id"])
        if not os.path.exists(path):
            self.store.set_status(batch["id"], "failed", errors=_errors(
                "file_not_found", f"the input file {batch['input_file_id']} is gone", param="input_file_id"))
            return "failed"
        total = sum(1 for line in read_lines(path) if line.strip())
        self.store.set_counts(batch["id"], total, 0, 0)
        self.store.set_status(batch["id"], "in_progress", only_from=("validating",))
        return self.store.status(batch["id"])

    async def _run(self, batch: dict) -> str:
        """Runs what the record lacks; the status it ended in (finalizing, or cancelling)."""
        batch_id = batch["id"]
        record = os.path.join(self.store.work_dir(batch_id), "output.jsonl")
        before = BatchCounts()
        out = None
        runner = BatchRunner(self.upstream, lambda line: out.write(line), window=self.window,
                             min_priority=BATCH_PRIORITY, endpoint=batch["endpoint"], on_line=self.metrics.on_line)

        def already_done(output: dict) -> None:
            runner.mark_done(output)
            if output.get("error") is None:
                before.num_completed += 1
                usage = output["response"]["body"]["usage"]
                before.num_prompt_tokens += usage["prompt_tokens"]
                before.num_completion_tokens += usage["completion_tokens"]
            else:
                before.num_failed += 1

        read_finished(record, already_done)
        out = OutputFile(record)
        total = self.store.batch(batch_id)["request_counts"]["total"]  # as validation counted it
        work = asyncio.ensure_future(runner.run(read_lines(self.store.file_path(batch["input_file_id"]))))

        def save_counts() -> None:
            counts = runner.counts
            self.store.set_counts(batch_id, total, before.num_completed + counts.num_completed,
                                  before.num_failed + counts.num_failed,
                                  before.num_prompt_tokens + counts.num_prompt_tokens,
                                  before.num_completion_tokens + counts.num_completion_tokens)

        try:
            while not work.done():
                await asyncio.wait({work}, timeout=POLL_S)
                if work.done():
                    break
                save_counts()
                if self.store.status(batch_id) == "cancelling":
                    work.cancel()  # aborts what is in flight; what finished stays in the record
                    with contextlib.suppress(asyncio.CancelledError):
                        await work
                    return "cancelling"
            work.result()
        finally:
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
            out.close()
        save_counts()
        if self.store.set_status(batch_id, "finalizing", only_from=("in_progress",)):
            return "finalizing"
        return self.store.status(batch_id)  # cancelled just as it ended

    def _finalize(self, batch_id: str, final_status: str) -> None:
        """Splits the record into the output and error files and ends the batch; when that
        fails (a full disk) the batch is as it was, with neither file."""
        record = os.path.join(self.store.work_dir(batch_id), "output.jsonl")
        hex_id = batch_id.removeprefix("batch_")
        ids = {"output": f"file-{hex_id}-output", "error": f"file-{hex_id}-errors"}
        num_lines = {"output": 0, "error": 0}
        try:
            with disk_full_named(self.store.file_path(ids["output"])), \
                    open(self.store.file_path(ids["output"]), "wb") as output, \
                    open(self.store.file_path(ids["error"]), "wb") as errors:
                if os.path.exists(record):
                    with open(record, "rb") as f:
                        for line in f:
                            kind = "output" if msgspec.json.decode(line).get("error") is None else "error"
                            (output if kind == "output" else errors).write(line)
                            num_lines[kind] += 1
            with self.store.transaction():
                file_ids = {kind: file_id for kind, file_id in ids.items() if num_lines[kind]}
                for kind, file_id in file_ids.items():
                    self.store.add_file(file_id, f"{batch_id}_{kind}.jsonl", "batch_output")
                self.store.set_status(batch_id, final_status, output_file_id=file_ids.get("output"),
                                      error_file_id=file_ids.get("error"))
        except BaseException:
            for file_id in ids.values():
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.store.file_path(file_id))
            raise
        for kind, file_id in ids.items():
            if not num_lines[kind]:
                os.remove(self.store.file_path(file_id))


def _try_lock(path: str) -> int | None:
    """An open descriptor holding the file's exclusive flock, or None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _errors(code: str, message: str, param: str | None = None) -> dict:
    return {"object": "list", "data": [{"code": code, "message": message, "param": param, "line": None}]}
