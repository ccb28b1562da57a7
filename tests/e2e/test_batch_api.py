"""OpenAI's Batch API on the gateway, driven by the real `openai` client: upload, create, poll,
download, list, cancel; a gateway killed with SIGKILL mid-batch and started again on the same
--batch-dir finishes it with each custom_id once; metrics by status."""
import json
import os
import signal
import time
from collections import Counter

import pytest
from openai import OpenAI

from stepserve.launcher import LocalCluster
from tests.batch_helpers import CHAT, COMPLETIONS, batch_lines, result_tokens, write_lines
from tests.e2e_helpers import TEST_WORKER_ARGS
from tests.gateway_helpers import curl, metric_samples
from tests.hf_model_folders import make_llama_folder, write_chat_template


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_chat_template(make_llama_folder(str(tmp_path_factory.mktemp("batch-api") / "llama")))


@pytest.fixture(scope="module")
def cluster(folder):
    with LocalCluster(folder, 1, worker_args=TEST_WORKER_ARGS) as running:
        yield running


def openai_client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def wait_for(client: OpenAI, batch_id: str, statuses: tuple[str, ...], timeout_s: float = 240.0, until=None):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses or (until is not None and until(batch)):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.1)


def outputs_of(client: OpenAI, file_id: str | None) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()] if file_id else []


def test_openai_client_batch_flow_end_to_end(cluster, tmp_path):
    url = cluster.start_gateway(["--batch-dir", str(tmp_path / "batches")])
    client = openai_client(url)
    lines, bad = batch_lines(200, bad_every=50, seed=3)
    src = write_lines(str(tmp_path / "in.jsonl"), lines)
    with open(src, "rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    assert uploaded.object == "file" and uploaded.bytes == os.path.getsize(src) and uploaded.purpose == "batch"
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "test"})
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    batch = wait_for(client, batch.id, ("completed", "failed"))
    assert batch.status == "completed", batch.errors
    # The file mixes both urls: a line for /v1/completions is refused (OpenAI requires every
    # line's url to be the batch's endpoint), as an error line naming both, and the job goes on.
    # (A bad line with invalid parameters is such a line too: its url is checked first.)
    mismatched = {n for n, line in enumerate(lines, 1)
                  if bad.get(n) in (None, "invalid_params") and json.loads(line)["url"] == COMPLETIONS}
    num_failed = len(bad.keys() | mismatched)
    assert batch.request_counts.total == len(lines)
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(lines) - num_failed, num_failed)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    results, errors = outputs_of(client, batch.output_file_id), outputs_of(client, batch.error_file_id)
    assert len(results) == len(lines) - num_failed and len(errors) == num_failed
    assert all(o["response"]["status_code"] == 200 and len(result_tokens(o)) == 4 for o in results)
    assert all(o["error"]["code"] and o["error"]["message"] for o in errors)
    assert {o["error"]["line"] for o in errors if o["error"]["code"] == "url_mismatch"} == mismatched
    assert all(COMPLETIONS in o["error"]["message"] and CHAT in o["error"]["message"]
               for o in errors if o["error"]["code"] == "url_mismatch")
    assert sorted(o["custom_id"] for o in results) == sorted(
        json.loads(line)["custom_id"] for n, line in enumerate(lines, 1) if n not in bad.keys() | mismatched)
    assert batch.usage.output_tokens == 4 * len(results)
    assert batch.usage.input_tokens == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in results) > 0
    assert batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens

    assert batch.id in [b.id for b in client.batches.list()]
    assert {uploaded.id, batch.output_file_id} <= {f.id for f in client.files.list()}
    assert client.files.retrieve(uploaded.id).filename == "in.jsonl"
    status, metrics = curl(f"{url}/metrics")
    samples = metric_samples(metrics)
    assert samples[("stepserve:batch_jobs", (("status", "completed"),))] == 1
    assert samples[("stepserve:batch_requests_total", (("status", "completed"),))] == len(lines) - num_failed
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(Exception) as gone:
        client.files.retrieve(uploaded.id)
    assert getattr(gone.value, "status_code", None) == 404


def test_cancel_aborts_what_is_in_flight_and_keeps_what_finished(cluster, tmp_path):
    url = cluster.start_gateway(["--batch-dir", str(tmp_path / "batches"), "--batch-window", "4"])
    client = openai_client(url)
    lines, _ = batch_lines(400, max_tokens=64, bad_every=1000, seed=4, urls=(COMPLETIONS,))
    with open(write_lines(str(tmp_path / "in.jsonl"), lines), "rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    wait_for(client, batch.id, ("completed",), until=lambda b: b.request_counts.completed >= 2)
    assert client.batches.cancel(batch.id).status == "cancelling"
    batch = wait_for(client, batch.id, ("cancelled",), timeout_s=60)
    assert batch.cancelling_at and batch.cancelled_at
    kept = outputs_of(client, batch.output_file_id)
    assert 2 <= len(kept) < len(lines) and len(kept) == batch.request_counts.completed
    deadline = time.monotonic() + 10  # the requests in flight were aborted, not left to run
    while (health := json.loads(curl(f"{url}/health")[1]))["num_running"] + health["num_waiting"]:
        assert time.monotonic() < deadline, health
        time.sleep(0.05)


def test_a_gateway_killed_mid_batch_and_restarted_finishes_it_with_each_custom_id_once(cluster, tmp_path):
    batch_dir = str(tmp_path / "batches")
    # 4 lines of 16 tokens in flight: the batch runs for seconds, longer than the counts lag.
    url = cluster.start_gateway(["--batch-dir", batch_dir, "--batch-window", "4"])
    client = openai_client(url)
    lines, bad = batch_lines(300, max_tokens=16, bad_every=100, seed=5, urls=(COMPLETIONS,))
    with open(write_lines(str(tmp_path / "in.jsonl"), lines), "rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    wait_for(client, batch.id, ("completed",), until=lambda b: b.request_counts.completed >= 0.3 * len(lines))
    gateway = cluster.gateways[-1]
    os.kill(gateway.pid, signal.SIGKILL)
    gateway.wait()
    cluster.gateways.remove(gateway)  # gone on purpose: the cluster's liveness checks must not count it
    # The kill came mid-batch: the record on disk holds some of the lines, not all.
    with open(os.path.join(batch_dir, "work", batch.id, "output.jsonl"), "rb") as f:
        recorded = sum(1 for line in f if line.endswith(b"\n"))
    assert 0.3 * len(lines) <= recorded < len(lines), recorded
    client = openai_client(cluster.start_gateway(["--batch-dir", batch_dir]))
    # The new gateway takes the batch up at start and may already have finished it.
    assert client.batches.retrieve(batch.id).status in ("in_progress", "finalizing", "completed")
    batch = wait_for(client, batch.id, ("completed", "failed"))
    assert batch.status == "completed"
    outputs = outputs_of(client, batch.output_file_id) + outputs_of(client, batch.error_file_id)
    keys = Counter(o["custom_id"] if not (o["error"] or {}).get("line") else o["error"]["line"] for o in outputs)
    assert len(outputs) == len(lines) and max(keys.values()) == 1
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(lines) - len(bad), len(bad))
    # Tokens of the lines done before the kill are counted once, from the record.
    answered = outputs_of(client, batch.output_file_id)
    assert batch.usage.output_tokens == 16 * len(answered)
    assert batch.usage.input_tokens == sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in answered)


def test_two_batches_run_side_by_side(cluster, tmp_path):
    # Each batch keeps 2 requests of 32 tokens in flight, and the second, created after the first,
    # answers lines while the first still runs. Each has 600 lines (9,600 steps: seconds on 2 quiet
    # cores), far more than the second's first line can take however fast the host, and neither ends
    # before it is cancelled; both are, so their length costs nothing.
    url = cluster.start_gateway(["--batch-dir", str(tmp_path / "batches"), "--batch-window", "2"])
    client = openai_client(url)
    batch_ids = []
    for name, num_lines in (("first", 600), ("second", 600)):
        lines, _ = batch_lines(num_lines, max_tokens=32, bad_every=1000, seed=6, urls=(COMPLETIONS,))
        with open(write_lines(str(tmp_path / f"{name}.jsonl"), lines), "rb") as f:
            uploaded = client.files.create(file=f, purpose="batch")
        batch_ids.append(client.batches.create(input_file_id=uploaded.id, endpoint=COMPLETIONS,
                                               completion_window="24h").id)
    wait_for(client, batch_ids[1], ("completed",), until=lambda b: b.request_counts.completed >= 1)
    assert client.batches.retrieve(batch_ids[0]).status == "in_progress"
    for batch_id in batch_ids:
        client.batches.cancel(batch_id)
    for batch_id in batch_ids:
        assert wait_for(client, batch_id, ("cancelled",), timeout_s=60).status == "cancelled"
