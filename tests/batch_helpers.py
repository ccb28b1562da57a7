"""Test tools for batch jobs: OpenAI batch input files mixing completions, chat and bad lines,
and the output files read back."""
import gzip
import json
import random

BAD_KINDS = ("not_json", "invalid_url", "duplicate_custom_id", "invalid_params", "invalid_custom_id")
# What each kind of bad line is answered with: the error code in the output line.
BAD_CODES = {"not_json": "invalid_json", "invalid_url": "invalid_url", "duplicate_custom_id": "duplicate_custom_id",
             "invalid_params": "invalid_params", "invalid_custom_id": "invalid_custom_id"}
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")


COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def batch_lines(num_lines: int, max_tokens: int = 4, bad_every: int = 100, seed: int = 0,
                urls: tuple[str, ...] = (COMPLETIONS, CHAT)) -> tuple[list[str], dict]:
    """The lines of a batch input, and {line number: bad kind} of its bad lines (one in
    bad_every). Good lines take their url from `urls` in turn (by default alternating
    /v1/completions with text prompts and /v1/chat/completions), greedy, exactly max_tokens
    tokens, with return_token_ids."""
    rng = random.Random(seed)
    lines, bad = [], {}
    for i in range(num_lines):
        if i % bad_every == bad_every // 2:
            kind = BAD_KINDS[len(bad) % len(BAD_KINDS)]
            bad[i + 1] = kind
            lines.append(_bad_line(kind, i))
            continue
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
        common = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
        url = urls[i % len(urls)]
        if url == CHAT:
            body = {"messages": [{"role": "user", "content": text}], **common}
        else:
            body = {"prompt": text, **common}
        lines.append(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}))
    return lines, bad


def _bad_line(kind: str, i: int) -> str:
    line = {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}
    if kind == "not_json":
        return '{"custom_id": "req-' + str(i) + '", "body": '
    if kind == "invalid_url":
        line["url"] = "/v1/images/generations"
    elif kind == "duplicate_custom_id":
        line["custom_id"] = "req-0"
    elif kind == "invalid_params":
        line["body"]["temperature"] = -3
    else:
        line["custom_id"] = "x" * 1000
    return json.dumps(line)


def write_lines(path: str, lines: list[str]) -> str:
    with (gzip.open(path, "wt") if path.endswith(".gz") else open(path, "w")) as f:
        f.write("\n".join(lines) + "\n")
    return path


def read_outputs(path: str) -> list[dict]:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return [json.loads(line) for line in f]


def result_tokens(output: dict) -> list[int]:
    """The generated token ids of a successful output line (its one choice)."""
    return output["response"]["body"]["choices"][0]["token_ids"]


def prompt_tokens(output: dict) -> list[int]:
    body = output["response"]["body"]
    return body["prompt_token_ids"] if "prompt_token_ids" in body else body["choices"][0]["prompt_token_ids"]
