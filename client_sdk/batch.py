"""BatchCollector: gathers the outputs of many requests (each a Choice), with an in-flight window."""
import asyncio
from typing import Callable

from tqdm import tqdm

from client_sdk.choice import Choice
from protocol.client_messages import RequestOutput as WireOutput


class BatchCollector:
    def __init__(self, progress: bool = False, on_stop_string: Callable[[list[str]], None] = lambda ids: None):
        """on_stop_string: called with a request id whose choice a stop string ended, so that the
        caller aborts it on the scheduler."""
        self.choices: dict[str, Choice] = {}
        self.num_sent = 0
        self.num_done = 0
        self._on_stop_string = on_stop_string
        self._changed = asyncio.Event()
        self._progress = progress
        self._bar = None

    def add(self, request_id: str, choice: Choice) -> None:
        self.choices[request_id] = choice

    @property
    def num_in_flight(self) -> int:
        return self.num_sent - self.num_done

    def on_output(self, output: WireOutput) -> None:
        choice = self.choices[output.request_id]
        if choice.finished:
            return  # a late output after the choice ended (a stop string, a duplicate)
        choice.add(output)
        if choice.finished:
            self.num_done += 1
            if self._bar is not None:
                self._bar.update(1)
            if choice.stopped_by_string:
                self._on_stop_string([output.request_id])
            self._changed.set()

    async def wait_for_room(self, window: int) -> None:
        if self._progress and self._bar is None:
            self._bar = tqdm(total=len(self.choices), unit="req", dynamic_ncols=True)
        while self.num_in_flight >= window:
            self._changed.clear()
            await self._changed.wait()

    async def wait_all(self) -> None:
        while self.num_done < len(self.choices):
            self._changed.clear()
            await self._changed.wait()

    def unfinished_ids(self) -> list[str]:
        return [rid for rid, choice in self.choices.items() if not choice.finished]

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
