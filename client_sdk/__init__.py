"""The stepserve Python SDK: AsyncClient, Client (blocking) and LLM (local offline runs)."""
from client_sdk.client import AsyncClient
from client_sdk.errors import RequestError, ServiceError
from client_sdk.llm import LLM
from client_sdk.outputs import CompletionOutput, StreamDelta
from client_sdk.sync_client import Client
from protocol.sampling import SamplingParams

__all__ = ["AsyncClient", "Client", "LLM", "CompletionOutput", "StreamDelta", "RequestError",
           "ServiceError", "SamplingParams"]
