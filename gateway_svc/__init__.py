"""The HTTP gateway process: OpenAI's API (/v1/completions, /v1/chat/completions, /v1/models),
/health and Prometheus /metrics, in front of the scheduler.

A client of the scheduler like any SDK user: it talks to it through client_sdk.AsyncClient
(tokenizing, detokenizing, stop strings and n on this side), so any number of gateways may
share one scheduler. Imports no torch.
"""
