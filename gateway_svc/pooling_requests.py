"""Request bodies of the pooling endpoints, in OpenAI's shape (/v1/embeddings) and vLLM's
(/v1/score, /v1/rerank, /v1/classify), and which kind of model each endpoint needs.

Unknown fields are ignored, as vLLM does (truncate_prompt_tokens, add_special_tokens, user).
"""
from typing import Any, Literal

import msgspec

from gateway_svc.errors import bad_request
from protocol.client_messages import ModelInfo


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: str | list[Any]  # a text, texts, token ids or lists of token ids (completions.prompt_list)
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"  # base64: float32 little-endian values
    dimensions: int | None = None  # Matryoshka: the first N values (then normalised)
    user: str | None = None
    # vLLM's extras
    normalize: bool | None = None  # None: the model's default
    priority: int = 0


class ScoreRequest(msgspec.Struct, kw_only=True):
    text_1: str | list[str]  # one text against each text_2, or pairs of equal-length lists
    text_2: str | list[str]
    model: str | None = None
    priority: int = 0


class RerankRequest(msgspec.Struct, kw_only=True):
    query: str
    documents: list[str]
    model: str | None = None
    top_n: int = 0  # 0: every document
    priority: int = 0


class ClassificationRequest(msgspec.Struct, kw_only=True):
    input: str | list[Any]
    model: str | None = None
    activation: bool = True  # softmax over the labels (sigmoid for one label); False: the logits
    priority: int = 0


def task_of(info: ModelInfo) -> str:
    """What the served model does: "generate", or its pooling task ("embed", "classify")."""
    return "generate" if info.pooling is None else info.pooling.task


def require_task(info: ModelInfo, model_name: str, endpoint: str, tasks: tuple[str, ...]) -> None:
    """A 400 when the served model cannot answer this endpoint (a generative model asked for
    embeddings, an embedder asked for a completion), naming what it is and what it needs."""
    task = task_of(info)
    if task in tasks:
        return
    needs = " or ".join(f"--task {t}" for t in tasks)
    raise bad_request(f"{endpoint} needs a model served with {needs}; `{model_name}` is served with --task {task}",
                      "wrong_model_task", param="model")

