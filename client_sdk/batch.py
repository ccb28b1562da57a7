"""BatchCollector: gathers the outputs of many requests in input order, with an in-flight window."""
import asyncio

from tqdm import tqdm

from protocol.client_messages import RequestOutput


class BatchCollector:
    def __init__(self, request_ids: list[str], progress: bool = False):
        self._index = {request_id: i for i, request_id in enumerate(request_ids)}
        n = len(request_ids)
        self.token_ids: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list = [None] * n
        self.last: list[RequestOutput | None] = [None] * n
        self.num_sent = 0
        self.num_done = 0
        self._changed = asyncio.Event()
        self._bar = tqdm(total=n, unit="req", dynamic_ncols=True) if progress else None

    @property
    def num_in_flight(self) -> int:
        return self.num_sent - self.num_done

    def on_output(self, output: RequestOutput) -> None:
        i = self._index[output.request_id]
        if self.last[i] is not None and self.last[i].finish_reason is not None:
            return  # a late duplicate after the request ended
        self.token_ids[i].extend(output.new_token_ids)
        if output.logprobs:
            self.logprobs[i] = (self.logprobs[i] or []) + list(output.logprobs)
        self.last[i] = output
        if output.finish_reason is not None:
            self.num_done += 1
            if self._bar is not None:
                self._bar.update(1)
            self._changed.set()

    async def wait_for_room(self, window: int) -> None:
        while self.num_in_flight >= window:
            self._changed.clear()
            await self._changed.wait()

    async def wait_all(self) -> None:
        while self.num_done < len(self.last):
            self._changed.clear()
            await self._changed.wait()

    def unfinished_ids(self) -> list[str]:
        return [rid for rid, i in self._index.items() if self.last[i] is None or self.last[i].finish_reason is None]

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
