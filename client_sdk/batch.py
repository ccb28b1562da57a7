"""BatchCollector: the prompts of a batch that are in flight, each a group of choices (one per
n), filled from the scheduler's outputs.

A prompt whose choices have all ended moves to `ready` for the caller and is forgotten here,
so what the collector holds is bounded by the window in flight, never by the batch: the same
machinery serves generate_batch (a list in input order) and generate_iter (as each finishes).
"""
import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Callable

from tqdm import tqdm

from client_sdk.choice import Choice
from protocol.client_messages import RequestOutput as WireOutput
from protocol.pooling import PoolingParams

DEFAULT_BATCH_WINDOW = 1024  # a batch job's requests in flight: several full steps of max_num_seqs 256


@dataclass(slots=True)
class PromptInFlight:
    index: int  # the prompt's position in the caller's input
    request_id: str
    prompt: str | None  # the text, when the prompt was text
    prompt_ids: list[int]
    choice_ids: list[str]  # the scheduler's request ids, one per choice
    choices: list[Choice]
    num_open: int = 0
    pooling: PoolingParams | None = None  # set: a pooling request, one choice


class BatchCollector:
    def __init__(self, total: int | None = None, progress: bool = False,
                 on_stop_string: Callable[[list[str]], None] = lambda ids: None):
        """total: the number of prompts, when known (for the progress bar). on_stop_string:
        called with a request id whose choice a stop string ended, so that the caller aborts it
        on the scheduler."""
        self.num_in_flight = 0  # choices sent and not finished: what the window bounds
        self.ready: deque[PromptInFlight] = deque()
        self._choice_of: dict[str, tuple[PromptInFlight, Choice]] = {}
        self._on_stop_string = on_stop_string
        self._changed = asyncio.Event()
        self._bar = tqdm(total=total, unit="req", dynamic_ncols=True) if progress else None

    def add(self, prompt: PromptInFlight) -> None:
        for choice_id, choice in zip(prompt.choice_ids, prompt.choices):
            self._choice_of[choice_id] = (prompt, choice)
        prompt.num_open = len(prompt.choices)
        self.num_in_flight += prompt.num_open

    def on_output(self, output: WireOutput) -> None:
        entry = self._choice_of.get(output.request_id)
        if entry is None:
            return  # a late output after its prompt was handed over (the abort after a stop string)
        prompt, choice = entry
        if choice.finished:
            return  # a late output after the choice ended (a stop string, a duplicate)
        choice.add(output)
        if not choice.finished:
            return
        self.num_in_flight -= 1
        prompt.num_open -= 1
        if choice.stopped_by_string:
            self._on_stop_string([output.request_id])
        if prompt.num_open == 0:
            for choice_id in prompt.choice_ids:
                del self._choice_of[choice_id]
            self.ready.append(prompt)
            if self._bar is not None:
                self._bar.update(1)
        self._changed.set()

    async def wait_for_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def unfinished_ids(self) -> list[str]:
        return [choice_id for choice_id, (_, choice) in self._choice_of.items() if not choice.finished]

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
