"""Client: the AsyncClient's methods, blocking, with its event loop on a background thread."""
import asyncio
import threading
from typing import Iterator

from client_sdk.client import AsyncClient
from client_sdk.outputs import RequestOutput, StreamDelta


class Client:
    def __init__(self, address: str = "tcp://127.0.0.1:5555", *, timeout_s: float | None = None,
                 request_timeout_s: float | None = None, curve_server_key: str | None = None,
                 curve_secret_key: str | None = None):
        """The arguments of AsyncClient."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stepserve-client", daemon=True)
        self._thread.start()
        self._async = self._call(self._make(address, timeout_s=timeout_s, request_timeout_s=request_timeout_s,
                                            curve_server_key=curve_server_key, curve_secret_key=curve_secret_key))

    @staticmethod
    async def _make(address, **kwargs) -> AsyncClient:
        return AsyncClient(address, **kwargs)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def generate(self, prompt, params=None, **kwargs):
        return self._call(self._async.generate(prompt, params, **kwargs))

    def generate_batch(self, prompts, params=None, **kwargs):
        return self._call(self._async.generate_batch(prompts, params, **kwargs))

    def generate_iter(self, prompts, params=None, **kwargs) -> Iterator[tuple[int, RequestOutput]]:
        """(index, RequestOutput) as each prompt finishes; prompts (any iterable) are read lazily
        on the client's thread."""
        return self._blocking(self._async.generate_iter(prompts, params, **kwargs))

    def embed(self, prompts, **kwargs):
        return self._call(self._async.embed(prompts, **kwargs))

    def classify(self, prompts, **kwargs):
        return self._call(self._async.classify(prompts, **kwargs))

    def score(self, text_1, text_2, **kwargs):
        return self._call(self._async.score(text_1, text_2, **kwargs))

    def embed_iter(self, prompts, **kwargs):
        """(index, EmbeddingRequestOutput) as each prompt finishes; prompts read lazily, as generate_iter's."""
        return self._blocking(self._async.embed_iter(prompts, **kwargs))

    def classify_iter(self, prompts, **kwargs):
        return self._blocking(self._async.classify_iter(prompts, **kwargs))

    def stream(self, prompt, params=None, **kwargs) -> Iterator[StreamDelta]:
        return self._blocking(self._async.stream(prompt, params, **kwargs))

    def _blocking(self, agen):
        try:
            while True:
                try:
                    yield self._call(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._call(agen.aclose())

    def text_codec(self):
        return self._call(self._async.text_codec())

    def served_model(self):
        return self._call(self._async.served_model())

    def apply_chat_template(self, messages, **kwargs):
        return self._call(self._async.apply_chat_template(messages, **kwargs))

    def abort(self, request_id):
        return self._call(self._async.abort(request_id))

    def model_info(self):
        return self._call(self._async.model_info())

    def default_sampling_params(self):
        return self._call(self._async.default_sampling_params())

    def health(self):
        return self._call(self._async.health())

    def wait_for_workers(self, num_workers: int = 1, timeout_s: float = 120.0):
        return self._call(self._async.wait_for_workers(num_workers, timeout_s))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
