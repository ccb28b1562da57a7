"""The stepserve Python SDK: AsyncClient, Client (blocking) and LLM (local offline runs)."""
from client_sdk.client import AsyncClient
from client_sdk.errors import AuthenticationError, ChatTemplateError, RequestError, ServiceError
from client_sdk.llm import LLM
from client_sdk.outputs import CompletionOutput, Logprob, RequestOutput, StreamDelta
from client_sdk.sync_client import Client
from protocol.sampling import SamplingParams

__all__ = ["AsyncClient", "Client", "LLM", "RequestOutput", "CompletionOutput", "Logprob", "StreamDelta",
           "RequestError", "ServiceError", "AuthenticationError", "ChatTemplateError", "SamplingParams"]
