"""stepserve: the `stepserve` command, the local launcher and `LLM` (offline runs on a service
it starts), over the SDK (client_sdk), the scheduler, the workers and the gateway."""
from client_sdk import __version__
from protocol.pooling import PoolingParams
from protocol.sampling import SamplingParams, StructuredOutputsParams
from stepserve.llm import LLM

__all__ = ["__version__", "LLM", "SamplingParams", "StructuredOutputsParams", "PoolingParams"]
