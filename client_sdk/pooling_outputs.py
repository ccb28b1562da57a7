"""What the SDK hands back for pooling requests, with vLLM's names: a PoolingRequestOutput per
prompt (its values as they came), and the shapes of embed, classify and score built from it."""
from dataclasses import dataclass

import numpy as np

from client_sdk.errors import request_failure


def floats_of(pooled: bytes) -> list[float]:
    """The wire's pooled values (float32, little-endian) as Python floats."""
    return np.frombuffer(pooled, "<f4").tolist()


@dataclass
class _Outcome:
    """A request's end: its error when it failed (outputs is then None)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: object
    finished: bool = True
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_code is None

    def raise_for_error(self):
        if self.error_code is not None:
            raise request_failure(self.request_id, self.error_code, self.error_message or "")
        return self


@dataclass
class PoolingOutput:
    data: list[float]  # the embedding, or the classifier's per-label values


@dataclass
class PoolingRequestOutput(_Outcome):
    outputs: PoolingOutput | None = None
    prompt: str | None = None  # the text, when the prompt was text


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput(_Outcome):
    outputs: EmbeddingOutput | None = None

    @classmethod
    def from_base(cls, output: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        return cls(output.request_id, output.prompt_token_ids,
                   EmbeddingOutput(output.outputs.data) if output.outputs is not None else None,
                   output.finished, output.error_code, output.error_message)


@dataclass
class ClassificationOutput:
    probs: list[float]  # per label (PoolingInfo.labels), softmax (sigmoid for one label) unless activation=False

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput(_Outcome):
    outputs: ClassificationOutput | None = None

    @classmethod
    def from_base(cls, output: PoolingRequestOutput) -> "ClassificationRequestOutput":
        return cls(output.request_id, output.prompt_token_ids,
                   ClassificationOutput(output.outputs.data) if output.outputs is not None else None,
                   output.finished, output.error_code, output.error_message)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput(_Outcome):
    outputs: ScoringOutput | None = None
