"""`stepserve run-batch`, a real process on a real cluster: a mixed completions + chat file with
1% bad lines, its outputs against generate_batch and transformers, kill -9 and --resume,
gzip in and out."""
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from client_sdk import AsyncClient, SamplingParams
from stepserve.launcher import LocalCluster
from tests.batch_helpers import BAD_CODES, batch_lines, prompt_tokens, read_outputs, result_tokens, write_lines
from tests.e2e_helpers import TEST_WORKER_ARGS, hf_greedy

MAX_TOKENS = 4


@pytest.fixture(scope="module")
def cluster(chat_folder):
    with LocalCluster(chat_folder, 1, worker_args=TEST_WORKER_ARGS) as running:
        yield running


def run_batch(cluster, *args: str, wait: bool = True):
    command = [sys.executable, "-m", "stepserve.cli", "run-batch", "--address", cluster.address, *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


def by_custom_id(outputs: list[dict]) -> dict[str, dict]:
    return {o["custom_id"]: o for o in outputs if o["error"] is None}


async def test_mixed_file_with_bad_lines_equals_generate_batch_and_transformers(cluster, chat_folder, tmp_path):
    # 10,000 lines, 1% bad: 17 s on 2 quiet vCPUs (AMD EPYC), the file written by run-batch as it goes
    lines, bad = batch_lines(10000, MAX_TOKENS)
    src = write_lines(str(tmp_path / "in.jsonl"), lines)
    out = str(tmp_path / "out.jsonl")
    summary = run_batch(cluster, "-i", src, "-o", out)
    assert f"{len(lines) - len(bad)} completed, {len(bad)} failed" in summary
    outputs = read_outputs(out)
    assert len(outputs) == len(lines)  # one output line per input line
    errors = [o for o in outputs if o["error"] is not None]
    assert sorted(o["error"].get("line") or _line_of(lines, o["custom_id"]) for o in errors) == sorted(bad)
    for o in errors:
        line_no = o["error"].get("line") or _line_of(lines, o["custom_id"])
        assert o["error"]["code"] == BAD_CODES[bad[line_no]] and o["error"]["message"]
        if o["response"] is not None:  # refused by the endpoint: its 400, as the gateway answers
            assert o["response"]["status_code"] == 400 and o["response"]["body"]["error"]["code"] == "invalid_params"
    results = by_custom_id(outputs)
    assert len(results) == len(lines) - len(bad) and all(len(result_tokens(o)) == MAX_TOKENS for o in results.values())

    # The same prompts through generate_batch: equal, token for token.
    good = [json.loads(line) for n, line in enumerate(lines, 1) if n not in bad]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    async with AsyncClient(cluster.address) as client:
        prompts = [line["body"]["prompt"] if "prompt" in line["body"]
                   else await client.apply_chat_template(line["body"]["messages"]) for line in good]
        reference = await client.generate_batch(prompts, greedy)
    for line, ref in zip(good, reference):
        result = results[line["custom_id"]]
        assert prompt_tokens(result) == ref.prompt_token_ids
        assert result_tokens(result) == ref.outputs[0].token_ids
    chat = results[good[1]["custom_id"]]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["role"] == "assistant"
    # ... and through transformers, on a sample.
    sample = [results[line["custom_id"]] for line in good[:40]]
    assert [result_tokens(o) for o in sample] == hf_greedy(chat_folder, [prompt_tokens(o) for o in sample], MAX_TOKENS)


def _line_of(lines: list[str], custom_id: str) -> int:
    return next(n for n, line in enumerate(lines, 1) if f'"custom_id": "{custom_id}"' in line)


def test_kill_9_at_40_percent_then_resume_runs_each_custom_id_once(cluster, tmp_path):
    lines, bad = batch_lines(300, MAX_TOKENS, seed=1)
    src = write_lines(str(tmp_path / "in.jsonl"), lines)
    reference = by_custom_id(read_outputs_of(run_batch, cluster, src, str(tmp_path / "whole.jsonl")))
    out = str(tmp_path / "out.jsonl")
    proc = run_batch(cluster, "-i", src, "-o", out, "--window", "16", wait=False)
    deadline = time.monotonic() + 120
    while _num_lines(out) < 0.4 * len(lines):
        assert proc.poll() is None and time.monotonic() < deadline, "run-batch ended before 40%"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    num_before = _num_lines(out)
    assert num_before < len(lines)
    with open(out, "ab") as f:
        f.write(b'{"id": "batch_req_torn", "custom_id": "req-')  # a line torn by the kill
    summary = run_batch(cluster, "-i", src, "-o", out, "--resume")
    assert f"{num_before} done before" in summary
    outputs = read_outputs(out)
    keys = Counter(o["custom_id"] if not (o["error"] or {}).get("line") else o["error"]["line"] for o in outputs)
    assert len(outputs) == len(lines) and max(keys.values()) == 1
    results = by_custom_id(outputs)
    assert {k: result_tokens(o) for k, o in results.items()} == {k: result_tokens(o) for k, o in reference.items()}


def test_gzip_input_and_output_and_a_cut_gzip_member_resume(cluster, tmp_path):
    lines, bad = batch_lines(120, MAX_TOKENS, bad_every=40, seed=2)
    src = write_lines(str(tmp_path / "in.jsonl.gz"), lines)
    out = str(tmp_path / "out.jsonl.gz")
    run_batch(cluster, "-i", src, "-o", out)
    whole = read_outputs(out)
    assert len(whole) == len(lines)
    with open(out, "rb") as f:
        data = f.read()
    with open(out, "wb") as f:
        f.write(data[:len(data) // 2])  # a gzip member cut short, as a kill leaves it
    run_batch(cluster, "-i", src, "-o", out, "--resume")
    outputs = read_outputs(out)
    assert len(outputs) == len(lines)
    assert {k: result_tokens(o) for k, o in by_custom_id(outputs).items()} == \
        {k: result_tokens(o) for k, o in by_custom_id(whole).items()}


def read_outputs_of(run, cluster, src: str, out: str) -> list[dict]:
    run(cluster, "-i", src, "-o", out)
    return read_outputs(out)


def _num_lines(path: str) -> int:
    if not os.path.exists(path):
        return 0
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return sum(1 for line in f if line.endswith(b"\n"))


def test_structured_output_lines(cluster, tmp_path):
    """response_format and structured_outputs in batch lines: the gateway's parsing, so each
    output follows its schema, and a regex that does not compile is that line's error alone."""
    import jsonschema
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "c": {"enum": ["a", "b"]}},
              "required": ["n", "c"], "additionalProperties": False}
    lines = [json.dumps({"custom_id": f"s-{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"prompt": f"item {i}", "max_tokens": 60, "temperature": 0.7, "seed": i,
                                  "response_format": {"type": "json_schema", "json_schema": {"name": "s",
                                                                                            "schema": schema}}}})
             for i in range(20)]
    lines.append(json.dumps({"custom_id": "bad", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": "x", "structured_outputs": {"regex": "(unclosed"}}}))
    out = str(tmp_path / "out.jsonl")
    run_batch(cluster, "-i", write_lines(str(tmp_path / "in.jsonl"), lines), "-o", out)
    outputs = {o["custom_id"]: o for o in read_outputs(out)}
    for i in range(20):
        jsonschema.validate(json.loads(outputs[f"s-{i}"]["response"]["body"]["choices"][0]["text"]), schema)
    assert "does not compile" in json.dumps(outputs["bad"])
