"""The inputs of a batch call (generate_iter, generate_batch), read one prompt at a time: any
iterable or async iterable of prompts, with one value for all or an iterable of one each for
the sampling params, priorities and request ids."""
import itertools
from typing import AsyncIterable, AsyncIterator, Iterable, Iterator


def per_prompt(value, scalar_type: type) -> Iterator:
    """One value for every prompt, or an iterable of one each."""
    if value is None or isinstance(value, scalar_type):
        return itertools.repeat(value)
    return iter(value)


async def aiter_of(items: Iterable | AsyncIterable) -> AsyncIterator:
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def prompt_items(prompts: Iterable | AsyncIterable, params: Iterator, priorities: Iterator,
                       request_ids: Iterator | None) -> AsyncIterator[tuple]:
    """(prompt, params, priority, request id) per prompt, read one at a time."""
    index = 0
    async for prompt in aiter_of(prompts):
        try:
            item = (prompt, next(params), next(priorities), next(request_ids) if request_ids is not None else None)
        except StopIteration:
            raise ValueError(f"more prompts than sampling params, priorities or request ids (prompt {index})") from None
        yield item
        index += 1
