"""The ids of what the gateway answers with: completions, files, batches and a batch's output
lines. Random, so that gateways (or processes) sharing a --batch-dir need no counter between them."""
import uuid


def new_id(prefix: str) -> str:
    """prefix, then 32 random hex digits: the prefix ends with its separator, as in OpenAI's ids
    ("chatcmpl-", "cmpl-", "file-", "batch_", "batch_req_")."""
    return f"{prefix}{uuid.uuid4().hex}"
