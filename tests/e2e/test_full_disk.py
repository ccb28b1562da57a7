"""A disk that fills under a batch job, on a real filesystem: a tmpfs of a few MiB mounted for
this module (mounting needs root, which the suite has here), filled by a test file until the
kernel answers ENOSPC, then emptied again.

- `stepserve run-batch` whose output fills the disk ends with one line naming ENOSPC and the
  path, its output keeps whole lines only (a .gz one stays a whole gzip), and `--resume` once
  there is space finishes it with each custom_id once.
- A Batch API job whose --batch-dir fills mid-batch ends `failed` with a disk_full error naming
  the path; its record keeps whole lines, SQLite its state; the gateway answers chats meanwhile
  and refuses an upload with 507; a batch created once there is space completes.
"""
import errno
import gzip
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import pytest
from openai import APIStatusError

from stepserve.launcher import LocalCluster
from tests.batch_helpers import COMPLETIONS, batch_lines, read_outputs, write_lines
from tests.e2e.test_batch_api import openai_client, outputs_of, wait_for
from tests.e2e_helpers import TEST_WORKER_ARGS

DISK_SIZE = "4m"


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    mount = str(tmp_path_factory.mktemp("small-disk"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", mount],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"this test mounts a small tmpfs, which needs root: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", mount], check=True)


@pytest.fixture(scope="module")
def cluster(disk, chat_folder):
    with LocalCluster(chat_folder, 1, worker_args=TEST_WORKER_ARGS) as running:
        yield running


def fill(disk: str, leave_bytes: int = 0) -> str:
    """Writes a file until the disk is full, then gives back leave_bytes; its path."""
    path = os.path.join(disk, "filler")
    with open(path, "ab", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        f.truncate(max(0, f.tell() - leave_bytes))
    return path


def whole_lines(path: str) -> list[dict]:
    """The file's lines, each checked whole (newline-ended JSON)."""
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        data = f.read()
    assert data.endswith(b"\n") or not data
    return [json.loads(line) for line in data.splitlines()]


def run_batch(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stepserve.cli", "run-batch", "--address", cluster.address, *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", ["out.jsonl", "out.jsonl.gz"])
def test_run_batch_output_fills_the_disk_then_resumes(cluster, disk, tmp_path, name):
    lines, _ = batch_lines(300, bad_every=1000, seed=7)
    src = write_lines(str(tmp_path / "in.jsonl"), lines)
    out = os.path.join(disk, name)
    filler = fill(disk, leave_bytes=8 << 10)
    try:
        failed = run_batch(cluster, "-i", src, "-o", out)
        assert failed.returncode == 1, failed.stderr[-3000:]
        assert f"no space left on device (ENOSPC) writing {out}" in failed.stderr
        assert "Traceback" not in failed.stderr
        kept = whole_lines(out)
        assert 0 < len(kept) < len(lines)
        assert f"the output keeps its {len(kept)} whole lines" in failed.stderr
    finally:
        os.remove(filler)
    resumed = run_batch(cluster, "-i", src, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{len(kept)} done before" in resumed.stdout
    outputs = read_outputs(out)
    assert Counter(o["custom_id"] for o in outputs) == Counter(json.loads(line)["custom_id"] for line in lines)
    os.remove(out)


def test_batch_api_job_on_a_full_batch_dir_fails_then_a_new_one_completes(cluster, disk, tmp_path):
    batch_dir = os.path.join(disk, "batches")
    url = cluster.start_gateway(["--batch-dir", batch_dir, "--batch-window", "4"])
    client = openai_client(url)
    # 4 lines of 16 tokens in flight: seconds of work, so the disk fills mid-batch.
    lines, _ = batch_lines(300, max_tokens=16, bad_every=1000, seed=8, urls=(COMPLETIONS,))
    with open(write_lines(str(tmp_path / "in.jsonl"), lines), "rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=COMPLETIONS, completion_window="24h")
    record = os.path.join(batch_dir, "work", batch.id, "output.jsonl")
    deadline = time.monotonic() + 120
    while not os.path.exists(record) or os.path.getsize(record) < 2000:
        assert time.monotonic() < deadline, client.batches.retrieve(batch.id)
        time.sleep(0.01)
    filler = fill(disk)
    try:
        batch = wait_for(client, batch.id, ("completed", "failed"))
        assert batch.status == "failed" and batch.failed_at
        [error] = batch.errors.data
        assert error.code == "disk_full" and "no space left on device (ENOSPC) writing" in error.message
        assert batch_dir in error.message
        kept = whole_lines(record)
        assert 0 < len(kept) < len(lines)
        assert len({o["custom_id"] for o in kept}) == len(kept)
        with sqlite3.connect(os.path.join(batch_dir, "state.sqlite3")) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        # The gateway keeps serving: a chat answered, an upload refused for want of space (the
        # room its reserve gave to record the failure taken too).
        fill(disk)
        chat = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=4,
                                              messages=[{"role": "user", "content": "hello"}])
        assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 4
        with pytest.raises(APIStatusError) as refused:
            with open(tmp_path / "in.jsonl", "rb") as f:
                client.files.create(file=f, purpose="batch")
        assert refused.value.status_code == 507 and "ENOSPC" in refused.value.message
        assert [f.id for f in client.files.list()] == [uploaded.id]  # nothing half kept
    finally:
        os.remove(filler)
    again = client.batches.create(input_file_id=uploaded.id, endpoint=COMPLETIONS, completion_window="24h")
    again = wait_for(client, again.id, ("completed", "failed"))
    assert again.status == "completed", again.errors
    outputs = outputs_of(client, again.output_file_id)
    assert sorted(o["custom_id"] for o in outputs) == sorted(json.loads(line)["custom_id"] for line in lines)
    assert client.batches.retrieve(batch.id).status == "failed"
