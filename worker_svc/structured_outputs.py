"""StructuredOutputs: grammar-constrained decoding on the worker (JSON schema, JSON object, regex,
choice, EBNF grammar), with xgrammar.

Where the state lives: on the worker, per request row, beside its token ids. The worker has the
tokenizer and the logits; the scheduler stays free of torch, of the tokenizer and of grammar
state, and sends SamplingParams.structured_outputs with the request like any other parameter.

Compilation, off the hot path: xgrammar's GrammarCompiler (built from the model's
tokenizer.json, its vocab size and EOS ids) runs in a one-thread pool; a request's compilation
is submitted when the worker registers it, before the step's forward, so it overlaps with that
forward (torch releases the GIL) and with the earlier chunks of a chunked prefill. Compiled
grammars are cached by their source (our futures by the canonical parameters, xgrammar's own
cache below): a schema compiles once per worker. The step waits only for the rows it samples
whose grammar is not ready yet, at their first token; other steps never wait. The first
structured request also imports xgrammar (and transformers) in that thread: a worker that never
sees one never loads them.

The mask reaches the sampler as a bitmask: each step, the matchers of the sampled rows with a
grammar fill their rows of an int32 bitmask [S, ceil(V / 32)] (BatchGrammarMatcher, which
releases the GIL) on a thread of their own, started when the runner builds the step's sampling
metadata before the forward, so the fill runs while the model does; the sampler waits for it
(StepGrammar.wait). On CPU the sampling kernel reads the bitmask as it reads each row's logits
(csrc/sample_rows.cpp: no pass of its own, no -inf written); elsewhere xgrammar's
apply_token_bitmask_inplace writes -inf into the logits.

Exactness: the worker executes plans in order and appends each sampled token itself
(RequestTable.advance -> on_sampled: the matcher accepts it, on the mask thread before the next
fill, or at once where it is a stop token), so with two plans in flight
(async scheduling) the next step's mask already includes the token the scheduler has not seen.
A request rescheduled after a recompute preemption (or swapped back in) arrives as new with its
generated tokens: a fresh matcher replays them once its grammar is compiled. Rows are freed with
the rest of the request (finished_ids, preempted_ids).

A grammar with after_token_ids (the answer of a reasoning model) leaves its row free until the
output holds those tokens (on_sampled watches the rows that wait, O(rows) only while one does);
the matcher starts with the token after them (a recompute replays what followed them).

A schema, regex or grammar that does not compile fails its request alone: the row gets no
token and the step result names the reason (StepResult.request_errors); the scheduler answers
invalid_params. Requests without constraints pay one dict emptiness check per step.
"""
import json
import logging
import re
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import msgspec
import numpy as np
import torch

from protocol.sampling import StructuredOutputsParams

log = logging.getLogger(__name__)
MAX_CACHED_GRAMMARS = 1024
_LOCATION = re.compile(r"\[[0-9:]+\] \S+:\d+: ")  # xgrammar's "[14:17:17] /project/cpp/x.cc:94: "


class GrammarError(ValueError):
    """The request's schema, regex or grammar does not compile; the message says why."""


@dataclass
class StepGrammar:
    """One step's masks: bitmask rows for the sampled rows `indices` (logits order), and the
    rows that fail (index -> reason)."""

    bitmask: torch.Tensor | None  # [S, ceil(V / 32)] int32, valid once wait() returned
    indices: list[int]
    errors: dict[int, str]
    filling: Future | None = None  # the fill running on the mask thread

    def wait(self) -> None:
        if self.filling is not None:
            self.filling.result()
            self.filling = None

    def apply(self, logits: torch.Tensor) -> None:
        """After wait() (the sampler waits first): -inf where the bitmask disallows."""
        if self.indices:
            import xgrammar
            xgrammar.apply_token_bitmask_inplace(logits, self.bitmask, vocab_size=logits.shape[-1],
                                                 indices=self.indices)


class _Row:
    __slots__ = ("grammar", "replay", "matcher", "error", "terminated", "after", "tail")

    def __init__(self, grammar: Future, replay: list[int], after: list[int] | None = None):
        self.grammar, self.replay = grammar, replay  # replay: tokens generated before (re)scheduling
        self.matcher = None
        self.error: str | None = None
        self.terminated = False  # the matcher's is_terminated(), read when it accepts a stop token
        # Until the output holds `after` (params.after_token_ids), the row is free: `tail` keeps
        # its last len(after) tokens; then the grammar holds for what follows.
        self.after: list[int] | None = None
        self.tail: list[int] = []
        if after:
            self._wait_for(after)

    @property
    def waiting(self) -> bool:
        return self.after is not None

    def _wait_for(self, after: list[int]) -> None:
        self.after, generated, self.replay = after, self.replay, []
        self.saw(generated)

    def saw(self, tokens: list[int]) -> bool:
        """A waiting row's new tokens; True when they completed `after` (those after it, if any,
        are the grammar's replay)."""
        after, n = self.after, len(self.after)
        for i, token in enumerate(tokens):
            self.tail.append(token)
            if self.tail[-n:] == after:
                self.after, self.tail, self.replay = None, [], list(tokens[i + 1:])
                return True
        del self.tail[:-n]
        return False


class StructuredOutputs:
    def __init__(self, tokenizer_json: str | None, vocab_size: int, eos_token_ids: list[int]):
        self.tokenizer_json, self.vocab_size, self.eos_token_ids = tokenizer_json, vocab_size, eos_token_ids
        self.rows: dict[int, _Row] = {}
        self._waiting: set[int] = set()  # rows whose grammar starts after after_token_ids, not yet seen
        self._pool: ThreadPoolExecutor | None = None  # compiles grammars
        self._mask_thread: ThreadPoolExecutor | None = None  # fills a step's bitmask
        self._compiler = None
        self._grammars: OrderedDict[bytes, Future] = OrderedDict()  # canonical params -> compiled
        self._bitmask: torch.Tensor | None = None
        self._stop_tokens = frozenset(eos_token_ids)
        # The last for_step's sampled rows, and the positions and matchers of those it masked:
        # the rows whose tokens on_sampled hands to their matchers.
        self._step: tuple[np.ndarray, list[int], list] | None = None
        # (row ids, matchers, tokens) sampled but not yet accepted: the mask thread accepts them
        # before its next fill (a stop token is accepted at once: the next step must know
        # whether it ended the grammar).
        self._to_accept: tuple[list[int], list, list[int]] | None = None
        # _masked_rows' last answer: (the rows' state version, the rows, the answer); the version
        # counts every change of a row's state (added, removed, matcher started, grammar ended).
        self._version = 0
        self._masked: tuple[int, np.ndarray, tuple | None] | None = None
        self._batch_matcher = None

    # ---- membership ------------------------------------------------------------------------

    def add(self, row: int, params: StructuredOutputsParams | None, token_ids: list[int], num_prompt: int) -> None:
        """token_ids: the request's prompt, then what it generated before (a recompute)."""
        if params is not None:
            state = self.rows[row] = _Row(self._compiled(params), token_ids[num_prompt:], params.after_token_ids)
            if state.waiting:
                self._waiting.add(row)
            self._version += 1

    def remove(self, rows: list[int]) -> None:
        if self.rows:
            for row in rows:
                self.rows.pop(row, None)
                self._waiting.discard(row)
            self._version += 1

    def _compiled(self, params: StructuredOutputsParams) -> Future:
        key = msgspec.json.encode(msgspec.structs.replace(params, after_token_ids=None), order="sorted")
        grammar = self._grammars.get(key)
        if grammar is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-compiler")
            grammar = self._grammars[key] = self._pool.submit(self._compile, params)
            if len(self._grammars) > MAX_CACHED_GRAMMARS:
                self._grammars.popitem(last=False)
        else:
            self._grammars.move_to_end(key)
        return grammar

    def _compile(self, params: StructuredOutputsParams):
        """In the pool's thread: the compiled grammar, or GrammarError."""
        compiler = self._grammar_compiler()
        try:
            if params.json is not None:
                schema = json.loads(params.json) if isinstance(params.json, str) else params.json
                return compiler.compile_json_schema(json.dumps(bounded_strings_as_patterns(schema)),
                                                    any_whitespace=False)
            if params.json_object:  # OpenAI's json_object: an object (xgrammar's builtin is any value)
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if params.regex is not None:
                return compiler.compile_regex(params.regex)
            if params.choice is not None:
                return compiler.compile_grammar(choice_grammar(params.choice))
            return compiler.compile_grammar(params.grammar)
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / ValueError subclasses
            kind = next(name for name in ("json", "json_object", "regex", "choice", "grammar")
                        if getattr(params, name) not in (None, False))
            reason = _LOCATION.sub("", str(e)).strip()
            raise GrammarError(f"structured_outputs.{kind} does not compile: {reason}") from None

    def _grammar_compiler(self):
        if self._compiler is None:
            if self.tokenizer_json is None:
                raise GrammarError("structured outputs need the model's tokenizer, and this model has none")
            self._compiler = grammar_compiler(self.tokenizer_json, self.vocab_size, self.eos_token_ids)
        return self._compiler

    # ---- one step ----------------------------------------------------------------------------

    def for_step(self, rows: np.ndarray) -> StepGrammar | None:
        """rows: the sampled rows in logits order. Waits for grammars still compiling."""
        self._step = None
        to_accept, self._to_accept = self._to_accept, None
        masked = self._masked_rows(rows)
        if masked is None:
            if to_accept is not None:  # the thread runs jobs in order: before any later fill
                self._mask_thread.submit(_accept, *to_accept)
            return None
        errors, indices, matchers = masked
        self._step = (rows, indices, matchers)
        bitmask = self._bitmask_for(len(rows))
        filling = None
        if matchers or to_accept is not None:
            if self._mask_thread is None:
                self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
            filling = self._mask_thread.submit(self._accept_and_fill, to_accept, matchers, bitmask, indices)
        # A terminated matcher (the grammar is complete) allows only EOS; one that ignores EOS
        # goes on unconstrained, as vLLM's does.
        return StepGrammar(bitmask, indices, errors, filling)

    def _masked_rows(self, rows: np.ndarray) -> tuple[dict[int, str], list[int], list] | None:
        """For the sampled rows (logits order): the failed ones' reasons by index, the indices
        to mask and their matchers; None where no row is constrained. Kept while the rows and
        every row's state stay the same (a steady batch of decodes), so such a step pays one
        comparison of the rows, not a look-up per row."""
        if not self.rows:
            return None
        if self._masked is not None and self._masked[0] == self._version and np.array_equal(self._masked[1], rows):
            return self._masked[2]
        constrained = [(i, self.rows[r]) for i, r in enumerate(rows.tolist()) if r in self.rows]
        masked = None
        if constrained:
            errors, indices, matchers = {}, [], []
            for i, state in constrained:
                if state.waiting:
                    continue
                if state.matcher is None and state.error is None:
                    self._start_matcher(state)
                if state.error is not None:
                    errors[i] = state.error
                elif not state.terminated:
                    indices.append(i)
                    matchers.append(state.matcher)
            masked = errors, indices, matchers
        self._masked = (self._version, rows.copy(), masked)
        return masked

    def _start_matcher(self, state: _Row) -> None:
        import xgrammar
        self._version += 1
        try:
            state.matcher = xgrammar.GrammarMatcher(state.grammar.result(), override_stop_tokens=self.eos_token_ids)
        except GrammarError as e:
            state.error = str(e)
            return
        for token in state.replay:
            if not state.matcher.accept_token(token):
                state.error = f"the tokens generated before rescheduling do not follow the grammar ({token})"
                return
        state.replay = []
        state.terminated = state.matcher.is_terminated()

    def _bitmask_for(self, num_rows: int) -> torch.Tensor:
        import xgrammar
        if self._bitmask is None or self._bitmask.shape[0] < num_rows:
            self._bitmask = xgrammar.allocate_token_bitmask(max(num_rows, 64), self.vocab_size)
            self._batch_matcher = self._batch_matcher or xgrammar.BatchGrammarMatcher()
        return self._bitmask[:num_rows]

    def _accept_and_fill(self, to_accept, matchers: list, bitmask: torch.Tensor, indices: list[int]) -> None:
        """On the mask thread: the last step's tokens accepted, then this step's bitmask filled."""
        if to_accept is not None:
            _accept(*to_accept)
        if matchers:
            self._batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask, indices)

    def on_sampled(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """rows got tokens: the matchers that constrained them this step (for_step's) are to accept
        them, on the mask thread before its next fill (while the next forward runs), one
        accept_token call each (xgrammar's batch_accept_token took twice as long for 256
        matchers: its result list is converted element by element)."""
        step, self._step = self._step, None
        if self._waiting and len(rows):
            self._watch_for_the_start(rows, tokens)
        if step is None or not len(rows):  # nothing masked, or nothing sampled (a prefill chunk)
            return
        step_rows, indices, matchers = step
        assert np.array_equal(step_rows, rows), "the sampled rows are the rows for_step masked"
        if not matchers:
            return
        now, later = [], []
        for row, matcher, token in zip(rows[indices].tolist(), matchers, tokens[indices].tolist()):
            (now if token in self._stop_tokens else later).append((row, matcher, token))
        for row, matcher, token in now:
            _accept([row], [matcher], [token])
            self.rows[row].terminated = matcher.is_terminated()
            self._version += 1
        if later:
            self._to_accept = tuple(map(list, zip(*later)))


    def _watch_for_the_start(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Rows whose grammar waits for its start (after_token_ids) see their new token; one that
        completed it is constrained from its next token on. O(rows) only while such a row exists."""
        for i, row in enumerate(rows.tolist()):
            if row in self._waiting and self.rows[row].saw([int(tokens[i])]):
                self._waiting.discard(row)
                self._version += 1


def _accept(rows: list[int], matchers: list, tokens: list[int]) -> None:
    for row, matcher, token in zip(rows, matchers, tokens):
        if not matcher.accept_token(token):
            log.warning("row %d: token %d does not follow its grammar", row, token)


# A JSON string's characters: not '"', not '\\', not a control character (as a regex over the
# string's content, which is how xgrammar applies a schema's pattern).
_PLAIN_CHARACTERS = '[^"\\\\\\u0000-\\u001f]'


def bounded_strings_as_patterns(schema):
    """The schema with each string bounded by minLength / maxLength (and no pattern, format,
    enum or const of its own) given the pattern of those bounds over plain characters.

    Why: xgrammar 0.2.9 writes such a string as [^"\\\r\n]{min,max}, which admits raw control
    characters (NUL, tab, ...), so a model could emit a string that no JSON parser accepts
    (seen: '{"name": "\x00\x00"}' from a random-weight model). Its rule for a pattern excludes
    them. The language is otherwise the same: neither admits escapes inside a bounded string."""
    if isinstance(schema, list):
        return [bounded_strings_as_patterns(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: bounded_strings_as_patterns(value) for key, value in schema.items()}
    if (out.get("type") == "string" and ("minLength" in out or "maxLength" in out)
            and not {"pattern", "format", "enum", "const"} & out.keys()):
        out["pattern"] = f"^{_PLAIN_CHARACTERS}{{{out.get('minLength', 0)},{out.get('maxLength', '')}}}$"
    return out


def choice_grammar(choices: list[str]) -> str:
    """EBNF whose language is exactly the choices (each a quoted literal, escaped)."""
    literals = ('"' + c.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'
                for c in choices)
    return "root ::= " + " | ".join(literals)


def grammar_compiler(tokenizer_json: str, vocab_size: int, eos_token_ids: list[int]):
    """xgrammar's compiler for this tokenizer. TokenizerInfo comes from xgrammar's own reading of
    a Hugging Face fast tokenizer (vocabulary, byte-level or byte-fallback decoding, prefix
    space), which serves the byte-level presets and BPE/SentencePiece tokenizer.json alike;
    vocab_size is the model's (its logits' width, padding entries included)."""
    import xgrammar
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json))
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=eos_token_ids)
    return xgrammar.GrammarCompiler(info, max_threads=2)
