"""Pooling: requests that end after their prompt's one step with a vector, not tokens.

A pooling model (an embedder or a classifier) says what it is in its hello (PoolingInfo), relayed
to clients in ModelInfo. A request with GenerateRequest.pooling set is a pooling request: its
prompt runs whole in one step and its output carries RequestOutput.pooled.
"""
from typing import Annotated, Literal

import msgspec

from protocol.limits import MAX_NAME_LEN, MAX_PROMPT_TOKENS

PoolingTask = Literal["embed", "classify"]
# What a worker serves a model folder as (its --task; auto: as the folder says), and how it pools
# (--pooling-type, PoolingInfo.pooling_type). Here, not in the worker: the CLI's flags name them
# without importing the server.
TASKS = ("auto", "generate", "embed", "classify")
POOLING_TYPES = ("CLS", "MEAN", "LAST")


class PoolingParams(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """vLLM's PoolingParams for one request.

    dimensions: Matryoshka, the first N values of the embedding (then normalised if normalize).
    normalize: L2-normalise the embedding; None takes the model's default (PoolingInfo.normalize).
    activation: classify: softmax over the labels (sigmoid when there is one label); False: logits.
    token_type_ids: segment ids of a BERT pair (a cross-encoder), one per prompt token; None: zeros.
    """

    task: PoolingTask = "embed"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    normalize: bool | None = None
    activation: bool = True
    token_type_ids: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]],
                              msgspec.Meta(max_length=MAX_PROMPT_TOKENS)] | None = None


class PoolingInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What a pooling model is: in WorkerHello and ModelInfo (None there: a generative model)."""

    task: PoolingTask
    size: Annotated[int, msgspec.Meta(ge=1)]  # embedding width, or the number of labels
    normalize: bool  # the default of PoolingParams.normalize
    labels: Annotated[list[Annotated[str, msgspec.Meta(max_length=MAX_NAME_LEN)]],
                      msgspec.Meta(max_length=1 << 20)] = []  # classify: id2label in order
    pooling_type: Annotated[str, msgspec.Meta(max_length=MAX_NAME_LEN)] = ""  # "CLS", "MEAN", "LAST"
    bidirectional: bool = False


def pooling_refusal(pooling: PoolingParams, num_prompt_tokens: int) -> str | None:
    """Why a pooling request with this prompt length is malformed, or None."""
    if pooling.token_type_ids is not None and len(pooling.token_type_ids) != num_prompt_tokens:
        return (f"pooling.token_type_ids has {len(pooling.token_type_ids)} entries for a prompt of "
                f"{num_prompt_tokens} tokens (one per token)")
    return None
