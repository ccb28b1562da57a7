"""The stepserve Python SDK: AsyncClient and Client (blocking), the clients of a running service.
It needs neither torch nor the server's packages (`LLM`, which starts its own service, is
`stepserve.LLM`)."""
from importlib.metadata import PackageNotFoundError, version

from client_sdk.client import AsyncClient
from client_sdk.errors import AuthenticationError, ChatTemplateError, RequestError, ServiceError
from client_sdk.outputs import CompletionOutput, Logprob, RequestOutput, StreamDelta
from client_sdk.pooling_outputs import (ClassificationOutput, ClassificationRequestOutput, EmbeddingOutput,
                                        EmbeddingRequestOutput, PoolingOutput, PoolingRequestOutput, ScoringOutput,
                                        ScoringRequestOutput)
from client_sdk.sync_client import Client
from protocol.pooling import PoolingInfo, PoolingParams
from protocol.sampling import SamplingParams, StructuredOutputsParams

try:
    __version__ = version("stepserve")  # pyproject.toml's, the one place it is written
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__", "AsyncClient", "Client", "RequestOutput", "CompletionOutput", "Logprob", "StreamDelta",
           "RequestError", "ServiceError", "AuthenticationError", "ChatTemplateError", "SamplingParams",
           "StructuredOutputsParams", "PoolingParams", "PoolingInfo", "PoolingOutput", "PoolingRequestOutput",
           "EmbeddingOutput", "EmbeddingRequestOutput", "ClassificationOutput", "ClassificationRequestOutput",
           "ScoringOutput", "ScoringRequestOutput"]
