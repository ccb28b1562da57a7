"""PoolingCalls: AsyncClient's calls for pooling models, vLLM's embed, classify and score.

Each is generate_iter with PoolingParams: the same window, lazy reading and aborts, so an
iterator over any number of inputs (embed_iter, classify_iter) runs with flat memory, and the
list calls wait for every input's output, in input order, raising the first failure.
"""
import contextlib
from typing import AsyncIterable, AsyncIterator, Iterable, Sequence

import msgspec

from client_sdk.errors import ServiceError
from client_sdk.pooling_outputs import (ClassificationRequestOutput, EmbeddingRequestOutput, PoolingRequestOutput,
                                        ScoringOutput, ScoringRequestOutput)
from client_sdk.scoring import cosine, score_pairs
from protocol.pooling import PoolingInfo, PoolingParams, PoolingTask

Prompts = str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]]
ParamsArg = PoolingParams | Iterable[PoolingParams] | None


def prompt_list(prompts: Prompts) -> list:
    """One prompt (a text, or token ids) or a sequence of them, as a list of prompts."""
    if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


def with_task(params: ParamsArg, task: PoolingTask):
    """The params (one, or one per prompt, read lazily) for this task: embed() embeds whatever
    task its params name, as vLLM's."""
    def one(p: PoolingParams | None) -> PoolingParams:
        if p is None:
            return PoolingParams(task=task)
        return p if p.task == task else msgspec.structs.replace(p, task=task)
    if params is None or isinstance(params, PoolingParams):
        return one(params)
    return map(one, params)


class PoolingCalls:
    async def pooling_model(self, call: str) -> PoolingInfo:
        """The served model's pooling facts; ValueError when it is a generative model."""
        info = await self.served_model()
        if info.model is None:
            raise ServiceError("no_worker", f"{call}: no worker has joined yet, so the model's kind is unknown")
        if info.pooling is None:
            raise ValueError(f"{call} needs a pooling model (an embedder or a classifier); {info.model!r} generates "
                             "text: serve it with --task embed, or serve a pooling model")
        return info.pooling

    async def embed_iter(self, prompts: Iterable | AsyncIterable, *, pooling_params: ParamsArg = None,
                         priority: int | Iterable[int] = 0, window: int | None = None, progress: bool = False,
                         request_ids: Iterable[str] | None = None
                         ) -> AsyncIterator[tuple[int, EmbeddingRequestOutput]]:
        """(index, EmbeddingRequestOutput) for each prompt as it finishes (a failed one has
        outputs None and its error_code), read and sent as generate_iter does."""
        async with contextlib.aclosing(self.generate_iter(
                prompts, with_task(pooling_params, "embed"), window=window, progress=progress, priority=priority,
                request_ids=request_ids)) as outputs:
            async for index, output in outputs:
                yield index, EmbeddingRequestOutput.from_base(output)

    async def classify_iter(self, prompts: Iterable | AsyncIterable, *, pooling_params: ParamsArg = None,
                            priority: int | Iterable[int] = 0, window: int | None = None, progress: bool = False,
                            request_ids: Iterable[str] | None = None
                            ) -> AsyncIterator[tuple[int, ClassificationRequestOutput]]:
        """embed_iter's, for a classifier: per label values (PoolingInfo.labels)."""
        async with contextlib.aclosing(self.generate_iter(
                prompts, with_task(pooling_params, "classify"), window=window, progress=progress, priority=priority,
                request_ids=request_ids)) as outputs:
            async for index, output in outputs:
                yield index, ClassificationRequestOutput.from_base(output)

    async def embed(self, prompts: Prompts, *, pooling_params: ParamsArg = None, priority: int = 0,
                    window: int | None = None, progress: bool = False) -> list[EmbeddingRequestOutput]:
        """The embedding of each prompt (a text or token ids), in input order; RequestError for
        the first that failed (a prompt past the step's budget, say)."""
        prompts = prompt_list(prompts)
        return await self._all(self.embed_iter(prompts, pooling_params=pooling_params, priority=priority,
                                               window=window or await self._default_window(len(prompts)),
                                               progress=progress), len(prompts))

    async def classify(self, prompts: Prompts, *, pooling_params: ParamsArg = None, priority: int = 0,
                       window: int | None = None, progress: bool = False) -> list[ClassificationRequestOutput]:
        """embed's, for a classifier."""
        prompts = prompt_list(prompts)
        return await self._all(self.classify_iter(prompts, pooling_params=pooling_params, priority=priority,
                                                  window=window or await self._default_window(len(prompts)),
                                                  progress=progress), len(prompts))

    async def score(self, text_1: str | Sequence[str], text_2: str | Sequence[str], *, priority: int = 0,
                    window: int | None = None, progress: bool = False) -> list[ScoringRequestOutput]:
        """vLLM's score: one text_1 against each text_2, or text_1[i] with text_2[i]. A
        cross-encoder (a classifier of one label) reads each pair as one input of two segments
        and scores its probability; an embedding model scores the cosine of the two embeddings."""
        firsts, seconds = score_pairs(text_1, text_2)
        pooling = await self.pooling_model("score")
        if pooling.task == "classify":
            return await self._cross_encoder_scores(pooling, firsts, seconds, priority, window, progress)
        one_first = isinstance(text_1, str) or len(firsts) == len(seconds) == 1 or len(set(firsts)) == 1
        texts = [firsts[0], *seconds] if one_first else [*firsts, *seconds]
        embeddings = await self.embed(texts, priority=priority, window=window, progress=progress)
        lefts = [embeddings[0]] * len(seconds) if one_first else embeddings[:len(firsts)]
        rights = embeddings[-len(seconds):]
        return [ScoringRequestOutput(f"{a.request_id}_{b.request_id}", a.prompt_token_ids + b.prompt_token_ids,
                                     ScoringOutput(cosine(a.outputs.embedding, b.outputs.embedding)))
                for a, b in zip(lefts, rights)]

    async def _cross_encoder_scores(self, pooling: PoolingInfo, firsts: list[str], seconds: list[str],
                                    priority: int, window: int | None, progress: bool) -> list[ScoringRequestOutput]:
        if pooling.size != 1:
            raise ValueError(f"score needs a cross-encoder of one label; this classifier has {pooling.size} "
                             f"({', '.join(pooling.labels)}): use classify")
        pairs = await (await self.text_codec()).encode_pairs_async(list(zip(firsts, seconds)))
        params = [PoolingParams(task="classify", token_type_ids=type_ids) for _, type_ids in pairs]
        outputs = await self._all(self.generate_iter(
            [ids for ids, _ in pairs], params, priority=priority, progress=progress,
            window=window or await self._default_window(len(pairs))), len(pairs))
        return [ScoringRequestOutput(o.request_id, o.prompt_token_ids, ScoringOutput(o.outputs.data[0]))
                for o in outputs]

    @staticmethod
    async def _all(outputs: AsyncIterator[tuple[int, PoolingRequestOutput]], num_prompts: int) -> list:
        """Every output in input order; the first failure raises (and aborts the rest)."""
        in_order = [None] * num_prompts
        async with contextlib.aclosing(outputs):
            async for index, output in outputs:
                in_order[index] = output.raise_for_error()
        return in_order
