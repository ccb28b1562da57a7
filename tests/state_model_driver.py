"""Test tool: drives a model with hand-built steps (token ids, positions and a forward context
built by the runner's own builders), standing in for the runner.

It keeps what the runner keeps per request (tokens, computed count, KV blocks, state slot),
staggers request arrivals and chunks prompts, so its steps mix first prefill chunks, later
chunks and decodes. It is deliberately hostile in one way: a freshly taken state slot is
filled with noise, not zeros, so a model that trusts the slot of a sequence with
num_computed_tokens == 0 produces wrong tokens.
"""
from dataclasses import dataclass, field

import numpy as np
import torch

from worker_svc.attention import build_attention_metadata
from worker_svc.forward_context import ForwardContext, forward_context
from worker_svc.kv_cache import ModelCaches
from worker_svc.models.state_layout import StateLayout
from worker_svc.state_slots import StateSlotPool


@dataclass
class DriverStep:
    """One forward: packed tokens, decodes first (the layout attention.py expects)."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    context: ForwardContext
    spans: list[slice]  # token span of each schedule entry, in schedule order
    logits_indices: torch.Tensor  # [S] last token of each sampling entry, in schedule order


@dataclass
class _Seq:
    tokens: list[int]
    num_prompt: int
    slot: int
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)


class StateModelDriver:
    def __init__(self, model, num_slots: int = 8, num_blocks: int = 96, block_size: int = 4,
                 seed: int = 0):
        spec, dtype = model.cache_spec(), torch.float32
        self.model, self.block_size = model, block_size
        self.gen = torch.Generator().manual_seed(seed)
        kv_shape = (2, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.caches = ModelCaches(
            kv=[torch.zeros(kv_shape, dtype=dtype) for _ in range(spec.num_attention_layers)],
            conv=[torch.zeros(num_slots, *spec.conv_state_shape, dtype=dtype)
                  for _ in range(spec.num_state_layers)],
            ssm=[torch.zeros(num_slots, *spec.ssm_state_shape, dtype=dtype)
                 for _ in range(spec.num_state_layers)])
        self.pool = StateSlotPool(num_slots)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))
        self.seqs: dict[str, _Seq] = {}
        self.step_kinds: list[set[str]] = []  # per step: {"first_chunk", "later_chunk", "decode"}

    # ---- request lifetime ------------------------------------------------------------

    def add(self, request_id: str, prompt: list[int]) -> None:
        slot = self.pool.allocate(request_id)
        for state in self.caches.conv + self.caches.ssm:  # noise, see the module docstring
            state[slot] = torch.randn(state.shape[1:], generator=self.gen)
        self.seqs[request_id] = _Seq(list(prompt), len(prompt), slot)

    def free(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id)
        self.free_blocks.extend(seq.blocks)
        self.pool.free(request_id)

    def output(self, request_id: str) -> list[int]:
        seq = self.seqs[request_id]
        return seq.tokens[seq.num_prompt:]

    # ---- one step --------------------------------------------------------------------

    def step(self, schedule: list[tuple[str, int]]) -> None:
        """Run one forward over (request_id, num_new_tokens) pairs; append sampled tokens."""
        step, sampled_ids = self.build_batch(schedule)
        hidden = self.forward(step)  # [T, hidden]
        logits = self.model.compute_logits(hidden[step.logits_indices])  # [S, vocab]
        for rid, token in zip(sampled_ids, logits.argmax(dim=-1).tolist()):
            self.seqs[rid].tokens.append(token)

    def forward(self, step: DriverStep) -> torch.Tensor:
        with forward_context(step.context):
            return self.model(step.input_ids, step.positions)

    def build_batch(self, schedule: list[tuple[str, int]]) -> tuple[DriverStep, list[str]]:
        """The step for `schedule`, and the ids that sample; advances num_computed."""
        order = sorted(range(len(schedule)), key=lambda i: schedule[i][1] != 1)  # decodes first
        input_ids, positions, slot_mapping, ends, sampled_ids = [], [], [], {}, []
        query_lens, computed, kinds = [], [], set()
        for i in order:
            rid, num_new = schedule[i]
            seq = self.seqs[rid]
            start, end = seq.num_computed, seq.num_computed + num_new
            assert end <= len(seq.tokens), f"{rid}: scheduled past its tokens"
            kinds.add("decode" if start >= seq.num_prompt else
                      "later_chunk" if start > 0 else "first_chunk")
            while len(seq.blocks) * self.block_size < end:
                seq.blocks.append(self.free_blocks.pop())
            input_ids += seq.tokens[start:end]
            positions += range(start, end)
            slot_mapping += [seq.blocks[p // self.block_size] * self.block_size
                             + p % self.block_size for p in range(start, end)]
            ends[i] = len(input_ids)
            query_lens.append(num_new)
            computed.append(start)
            seq.num_computed = end
        self.step_kinds.append(kinds)
        spans = [slice(ends[i] - schedule[i][1], ends[i]) for i in range(len(schedule))]
        logits_indices = []
        for i, (rid, _) in enumerate(schedule):
            if self.seqs[rid].num_computed == len(self.seqs[rid].tokens):  # sample the next one
                logits_indices.append(spans[i].stop - 1)
                sampled_ids.append(rid)
        seqs = [self.seqs[schedule[i][0]] for i in order]
        max_blocks = max(len(s.blocks) for s in seqs)
        i64 = np.int64
        query_lens, computed = np.array(query_lens, dtype=i64), np.array(computed, dtype=i64)
        context = ForwardContext(caches=self.caches)
        if self.caches.kv:
            tables = np.array([s.blocks + [0] * (max_blocks - len(s.blocks)) for s in seqs], dtype=i64)
            context.attn_metadata = build_attention_metadata(
                query_lens, computed, tables, np.array(slot_mapping, dtype=i64), self.block_size,
                torch.device("cpu"))
        if self.caches.conv:
            context.state_layout = StateLayout.build(
                query_lens, computed, np.array([s.slot for s in seqs], dtype=i64), torch.device("cpu"))
        step = DriverStep(torch.tensor(input_ids, dtype=torch.int64),
                          torch.tensor(positions, dtype=torch.int64), context, spans,
                          torch.tensor(logits_indices, dtype=torch.int64))
        return step, sampled_ids

    # ---- a tiny scheduler --------------------------------------------------------------

    def generate(self, prompts: dict[str, list[int]], max_new_tokens: int, chunk_size: int,
                 arrival_step: dict[str, int] | None = None) -> dict[str, list[int]]:
        """Greedy-generate every prompt; request r joins at arrival_step[r] (default: its index),
        prompts are cut into chunk_size chunks, and every running request runs every step."""
        arrival = arrival_step or {rid: i for i, rid in enumerate(prompts)}
        pending, outputs, step = dict(prompts), {}, 0
        while pending or self.seqs:
            for rid in [r for r in pending if arrival[r] <= step]:
                if self.pool.num_in_use < self.pool.num_slots:  # else it waits for a slot
                    self.add(rid, pending.pop(rid))
            schedule = [(rid, min(chunk_size, seq.num_prompt - seq.num_computed))
                        if seq.num_computed < seq.num_prompt else (rid, 1)
                        for rid, seq in self.seqs.items()]
            if schedule:
                self.step(schedule)
            for rid in [r for r in self.seqs if len(self.output(r)) == max_new_tokens]:
                outputs[rid] = self.output(rid)
                self.free(rid)  # frees the slot at once, so later arrivals reuse it
            step += 1
        return outputs
