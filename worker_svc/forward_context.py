"""The forward context: what one model forward needs besides its token ids and positions.

A model is called as `model(input_ids, positions)`, so that the same call can be traced and
compiled (torch.compile sees two [T] tensors and nothing whose shape varies otherwise). The
per-step data every attention or state layer needs (attention metadata, the state layout, and
the caches: the paged KV cache of each attention layer, the per-slot conv/SSM states of each
state layer) is set here by the runner for the duration of the forward, and read by the layers' ops at run time, the way vLLM's
`set_forward_context` does. The compiled graph calls those ops as opaque custom ops.
"""
import contextlib
import contextvars
from dataclasses import dataclass, field

from worker_svc.kv_cache import ModelCaches


@dataclass
class ForwardContext:
    caches: ModelCaches = field(default_factory=ModelCaches)
    attn_metadata: object | None = None  # attention.AttentionMetadata; None without attention
    state_layout: object | None = None  # models.state_layout.StateLayout for state models
    # [T] int64: each token's rope length, for rotary types that depend on a sequence length
    # (models/rotary.py); None for the others
    rope_lengths: object | None = None
    # Encoder models (models/bert.py): the step's sequences (encoder_attention.EncoderMetadata),
    # and each token's segment id, [T] int64 (None: all zeros)
    encoder_metadata: object | None = None
    token_type_ids: object | None = None


# A context variable, not a global: each thread sees its own (the ranks of an in-process
# tensor-parallel test run as threads, and a step's inputs may be prepared on another thread).
_current: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar(
    "stepserve_forward_context", default=None)


@contextlib.contextmanager
def forward_context(context: ForwardContext):
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def get_forward_context() -> ForwardContext:
    context = _current.get()
    assert context is not None, "a model forward runs inside forward_context(...)"
    return context
