"""The soak's client processes (benchmarks/soak.py starts them): each runs one kind of traffic
until a deadline and writes one JSON line per request to --out, what the soak counts:

    {"kind", "id", "outcome": ok | cancelled | error | lost | wrong, "detail", "t"}

- http: the openai client over HTTP, completions and chats, whole and streamed, n of 1 to 3,
  seeds, stop strings, structured outputs (a JSON schema, a choice), logprobs;
- disconnect: streams that the client closes after a few chunks (cancelled);
- sdk: client_sdk.AsyncClient over ZeroMQ: generate, stream, generate_batch;
- batches: `stepserve run-batch` jobs and Batch API jobs, in turn, each line answered once.

"ok" is an answer checked whole: each of its n choices once, every choice's token count within
max_tokens, exactly max_tokens when it ended by length, the usage equal to the tokens sent.
"wrong" is an answer that fails that check, "error" one that says why it failed (an HTTP status
with its code, an SDK error code), "lost" a request with no answer (a timeout, a connection
closed without one).

    python -m benchmarks.soak_clients http --url URL --address ADDR --until EPOCH --out FILE
"""
import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import openai

from client_sdk import AsyncClient, SamplingParams
from client_sdk.errors import RequestError, ServiceError

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
TIMEOUT_S = 120.0  # an answer later than this is counted lost
BACKOFF_S = 0.5  # after a failed request, as a client would wait before its next (no worker for a moment, say)


class Recorder:
    def __init__(self, path: str, kind: str):
        self._file = open(path, "a", buffering=1)
        self.kind = kind

    def __call__(self, outcome: str, request_id: str | None = None, detail: str = "", kind: str | None = None):
        self._file.write(json.dumps({"kind": kind or self.kind, "id": request_id, "outcome": outcome,
                                     "detail": detail[:300], "t": time.time()}) + "\n")


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))


def check_choices(tokens_by_index: dict[int, list], finish_by_index: dict[int, list], n: int, max_tokens: int,
                  usage_tokens: int | None) -> str:
    """What is wrong with an answer ('' when nothing): each index once, token counts, usage."""
    if sorted(finish_by_index) != list(range(n)):
        return f"choice indexes {sorted(finish_by_index)} for n={n}"
    for index, finishes in finish_by_index.items():
        num_tokens = len(tokens_by_index.get(index, []))
        if len(finishes) != 1:
            return f"choice {index} finished {len(finishes)} times: {finishes}"
        if finishes[0] not in ("length", "stop"):
            return f"choice {index} finish_reason {finishes[0]!r}"
        if num_tokens > max_tokens or (finishes[0] == "length" and num_tokens != max_tokens):
            return f"choice {index}: {num_tokens} tokens, finish_reason {finishes[0]}, max_tokens {max_tokens}"
    total = sum(len(t) for t in tokens_by_index.values())
    if usage_tokens is not None and usage_tokens != total:
        return f"usage says {usage_tokens} completion tokens, the choices hold {total}"
    return ""


def _http_error(e: Exception) -> tuple[str, str]:
    """(outcome, detail) of an openai exception."""
    if isinstance(e, openai.APIStatusError):
        code = (e.body or {}).get("code") if isinstance(e.body, dict) else None
        return "error", f"{e.status_code}:{code}"
    if isinstance(e, openai.APIError) and not isinstance(e, openai.APIConnectionError):
        return "error", f"stream:{getattr(e, 'code', None)}"  # an error event after the headers
    return "lost", f"{type(e).__name__}: {e}"


def _request_args(rng: random.Random, chat: bool) -> tuple[dict, int, int]:
    """(create() arguments, n, max_tokens) of a random request."""
    n = rng.choice((1, 1, 1, 2, 3))
    max_tokens = rng.randint(1, 24)
    extra = {"return_token_ids": True, "ignore_eos": True}
    args = {"max_tokens": max_tokens, "n": n, "temperature": rng.choice((0.0, 0.8)),
            "seed": rng.choice((None, rng.randint(0, 1000)))}
    roll = rng.random()
    if roll < 0.15:
        args["stop"] = [rng.choice("aeiou"), " "]
    elif roll < 0.25:
        extra["structured_outputs"] = {"choice": ["yes", "no", "maybe"]}
        extra["ignore_eos"] = False
    elif roll < 0.35 and chat:
        args["response_format"] = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
        extra["ignore_eos"] = False
        args["max_tokens"] = max_tokens = rng.randint(16, 40)
    if rng.random() < 0.2:
        if chat:
            args.update(logprobs=True, top_logprobs=2)
        else:
            args["logprobs"] = 2
    if chat:
        args["messages"] = [{"role": "user", "content": _text(rng)}]
    else:
        args["prompt"] = _text(rng)
    args["extra_body"] = extra
    return args, n, max_tokens


async def _one_http(client: openai.AsyncOpenAI, model: str, rng: random.Random, record: Recorder) -> bool:
    """One request, recorded; False when it failed."""
    chat = rng.random() < 0.5
    stream = rng.random() < 0.5
    args, n, max_tokens = _request_args(rng, chat)
    create = client.chat.completions.create if chat else client.completions.create
    kind = f"http_{'chat' if chat else 'completion'}_{'stream' if stream else 'whole'}"
    request_id = None
    try:
        if not stream:
            resp = await create(model=model, **args)
            request_id = resp.id
            tokens = {c.index: c.model_extra.get("token_ids") or [] for c in resp.choices}
            finishes = {}
            for c in resp.choices:
                finishes.setdefault(c.index, []).append(c.finish_reason)
            problem = check_choices(tokens, finishes, n, max_tokens, resp.usage.completion_tokens)
        else:
            tokens, finishes, usage = {}, {}, None
            events = await create(model=model, stream=True, stream_options={"include_usage": True}, **args)
            async for chunk in events:
                request_id = request_id or chunk.id
                if chunk.usage is not None:
                    usage = chunk.usage.completion_tokens
                for c in chunk.choices:
                    if c.index in finishes and (c.model_extra.get("token_ids") or c.finish_reason):
                        finishes[c.index].append("after-finish")
                    tokens.setdefault(c.index, []).extend(c.model_extra.get("token_ids") or [])
                    if c.finish_reason is not None:
                        finishes.setdefault(c.index, []).append(c.finish_reason)
            problem = check_choices(tokens, finishes, n, max_tokens, usage)
            if usage is None:
                problem = problem or "no usage chunk"
        record("wrong" if problem else "ok", request_id, problem, kind=kind)
        return True
    except Exception as e:  # noqa: BLE001 - every failure is an outcome to count
        outcome, detail = _http_error(e)
        record(outcome, request_id, detail, kind=kind)
        return False


async def _one_disconnect(client: openai.AsyncOpenAI, model: str, rng: random.Random, record: Recorder) -> bool:
    request_id = None
    try:
        events = await client.completions.create(model=model, prompt=_text(rng), max_tokens=200, stream=True,
                                                 extra_body={"ignore_eos": True})
        num_chunks = 0
        async for chunk in events:
            request_id = chunk.id
            num_chunks += 1
            if num_chunks >= rng.randint(1, 4):
                break
        await events.close()  # the connection closed mid-stream
        record("cancelled", request_id)
        return True
    except Exception as e:  # noqa: BLE001
        outcome, detail = _http_error(e)
        record(outcome, request_id, detail)
        return False


async def run_http(args, kind: str) -> None:
    record = Recorder(args.out, kind)
    rng = random.Random(args.seed)
    client = openai.AsyncOpenAI(base_url=f"{args.url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)
    model = (await client.models.list()).data[0].id
    one = _one_http if kind == "http" else _one_disconnect

    async def loop() -> None:
        while time.time() < args.until:
            if not await one(client, model, rng, record):
                await asyncio.sleep(BACKOFF_S)

    await asyncio.gather(*(loop() for _ in range(args.concurrency)))
    await client.close()


async def _one_sdk(client: AsyncClient, rng: random.Random, record: Recorder) -> bool:
    """One call, its requests recorded; False when one failed."""
    max_tokens = rng.randint(1, 24)
    n = rng.choice((1, 1, 2))
    params = SamplingParams(max_tokens=max_tokens, n=n, ignore_eos=True, temperature=rng.choice((0.0, 0.7)),
                            seed=rng.choice((None, 7)), logprobs=rng.choice((None, 1)))
    what = rng.choice(("generate", "stream", "batch"))
    kind = f"sdk_{what}"
    try:
        if what == "stream":
            tokens, finishes, request_id = {}, {}, None
            async for delta in client.stream(_text(rng), params):
                request_id = delta.request_id
                tokens.setdefault(delta.index, []).extend(delta.token_ids)
                if delta.finish_reason is not None:
                    finishes.setdefault(delta.index, []).append(delta.finish_reason)
            problem = check_choices(tokens, finishes, n, max_tokens, None)
            record("wrong" if problem else "ok", request_id, problem, kind=kind)
            return True
        prompts = [_text(rng) for _ in range(1 if what == "generate" else rng.randint(2, 8))]
        outputs = await client.generate_batch(prompts, params)
        if len(outputs) != len(prompts):
            record("wrong", None, f"{len(outputs)} outputs for {len(prompts)} prompts", kind=kind)
        all_ok = True
        for output in outputs:
            failed = next((o for o in output.outputs if o.finish_reason == "error"), None)
            if failed is not None:
                record("error", output.request_id, f"sdk:{failed.error_code}", kind=kind)
                all_ok = False
                continue
            finishes = {}
            for o in output.outputs:
                finishes.setdefault(o.index, []).append(o.finish_reason)
            problem = check_choices({o.index: o.token_ids for o in output.outputs}, finishes, n, max_tokens, None)
            record("wrong" if problem else "ok", output.request_id, problem, kind=kind)
        return all_ok
    except (ServiceError, RequestError) as e:
        record("error", getattr(e, "request_id", None), f"sdk:{e.code}", kind=kind)
    except TimeoutError as e:
        record("lost", None, f"TimeoutError: {e}", kind=kind)
    return False


async def run_sdk(args) -> None:
    record = Recorder(args.out, "sdk")
    rng = random.Random(args.seed)
    async with AsyncClient(args.address, timeout_s=TIMEOUT_S) as client:
        await client.wait_for_workers(1)

        async def loop() -> None:
            while time.time() < args.until:
                if not await _one_sdk(client, rng, record):
                    await asyncio.sleep(BACKOFF_S)

        await asyncio.gather(*(loop() for _ in range(args.concurrency)))


def batch_input(path: str, rng: random.Random, num_lines: int, max_tokens: int, urls: tuple[str, ...]) -> list[str]:
    """A batch file whose lines take their url from `urls` in turn; its custom_ids."""
    ids = []
    with open(path, "w") as f:
        for i in range(num_lines):
            custom_id = f"line-{i}-{rng.randrange(1 << 30)}"
            ids.append(custom_id)
            url = urls[i % len(urls)]
            body = {"max_tokens": max_tokens, "ignore_eos": True, "return_token_ids": True}
            if url == CHAT:
                body["messages"] = [{"role": "user", "content": _text(rng)}]
            else:
                body["prompt"] = _text(rng)
            f.write(json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + "\n")
    return ids


def check_batch_output(lines: list[dict], ids: list[str], max_tokens: int, record: Recorder, kind: str) -> None:
    """One record per input line: its answer checked, an id answered twice or never counted."""
    seen: dict[str, int] = {}
    for line in lines:
        seen[line["custom_id"]] = seen.get(line["custom_id"], 0) + 1
    by_id = {line["custom_id"]: line for line in lines}
    for custom_id in ids:
        line = by_id.get(custom_id)
        if line is None:
            record("lost", custom_id, "no output line", kind=kind)
        elif seen[custom_id] > 1:
            record("wrong", custom_id, f"answered {seen[custom_id]} times", kind=kind)
        elif line.get("error") is not None or line["response"]["status_code"] != 200:
            error = line.get("error") or line["response"]["body"].get("error") or {}
            record("error", custom_id, f"batch:{error.get('code')}", kind=kind)
        else:
            body = line["response"]["body"]
            [choice] = body["choices"]
            problem = check_choices({0: choice["token_ids"]}, {0: [choice["finish_reason"]]}, 1, max_tokens,
                                    body["usage"]["completion_tokens"])
            record("wrong" if problem else "ok", custom_id, problem, kind=kind)


def run_batch_job(args, rng: random.Random, record: Recorder, folder: str) -> None:
    src, out = os.path.join(folder, "in.jsonl"), os.path.join(folder, "out.jsonl")
    ids = batch_input(src, rng, 60, 8, (COMPLETIONS, CHAT))
    done = subprocess.run([sys.executable, "-m", "stepserve.cli", "run-batch", "--address", args.address,
                           "-i", src, "-o", out, "--window", "16"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        record("error", None, f"run-batch exit {done.returncode}: {done.stderr.strip()[-200:]}", kind="run_batch_job")
    with open(out) as f:
        check_batch_output([json.loads(line) for line in f], ids, 8, record, "run_batch_line")


def run_batch_api_job(client: openai.OpenAI, rng: random.Random, record: Recorder, folder: str) -> None:
    endpoint = rng.choice((COMPLETIONS, CHAT))  # every line's url is the batch's endpoint
    src = os.path.join(folder, "api-in.jsonl")
    ids = batch_input(src, rng, 40, 8, (endpoint,))
    with open(src, "rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")
    deadline = time.monotonic() + 600
    while batch.status not in ("completed", "failed", "cancelled", "expired") and time.monotonic() < deadline:
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    if batch.status != "completed":
        record("error" if batch.status == "failed" else "lost", batch.id, f"batch {batch.status}: {batch.errors}",
               kind="batch_api_job")
        return
    outputs = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            outputs += [json.loads(line) for line in client.files.content(file_id).text.splitlines()]
    check_batch_output(outputs, ids, 8, record, "batch_api_line")
    client.files.delete(uploaded.id)


def run_batches(args) -> None:
    record = Recorder(args.out, "batches")
    rng = random.Random(args.seed)
    client = openai.OpenAI(base_url=f"{args.url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)
    with tempfile.TemporaryDirectory() as folder:
        while time.time() < args.until:
            try:
                run_batch_job(args, rng, record, folder)
                if time.time() < args.until:
                    run_batch_api_job(client, rng, record, folder)
            except (openai.APIError, subprocess.TimeoutExpired, OSError) as e:
                record("lost", None, f"{type(e).__name__}: {e}", kind="batch_job")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak_clients", description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=("http", "disconnect", "sdk", "batches"))
    p.add_argument("--url", required=True, help="the gateway's")
    p.add_argument("--address", required=True, help="the scheduler's SDK address")
    p.add_argument("--until", type=float, required=True, help="no request starts after this time (epoch s)")
    p.add_argument("--out", required=True)
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (http, disconnect, sdk)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.kind == "batches":
        run_batches(args)
    elif args.kind == "sdk":
        asyncio.run(run_sdk(args))
    else:
        asyncio.run(run_http(args, args.kind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
