"""Bounds on everything a peer may send, checked when a frame is decoded.

One owner for the numbers: the message types use them as msgspec constraints, so a value past a
bound fails the decode of that request (the scheduler then fails it alone, see
codec.salvage_generate), and the SDK checks the same bounds before it sends.
"""

MAX_REQUEST_ID_LEN = 256
MAX_REQUESTS_PER_MESSAGE = 4096  # per Generate or Abort; the SDK splits larger batches
MAX_PROMPT_TOKENS = 1 << 20  # the model's max_model_len is checked too, by the scheduler
MAX_TOKENS = 1 << 20  # max_tokens and min_tokens
MAX_LOGPROBS = 20
MAX_N = 128  # completions per prompt; each is a request of its own on the scheduler
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_LEN = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024  # token ids in one logit_bias (OpenAI allows 300)
MAX_BAD_WORDS = 1024
MAX_ALLOWED_TOKEN_IDS = 1 << 20
MAX_GRAMMAR_LEN = 1 << 20  # characters of a JSON schema, regex or grammar; each choice
MAX_CHOICES = 4096

# The worker link: a worker's hello decides what the scheduler allocates for it.
MAX_NAME_LEN = 1024  # worker ids, group ids, model names, devices
MAX_BLOCKS = 1 << 23  # KV blocks per worker, device or host
MAX_STATE_SLOTS = 1 << 20
MAX_MODEL_LEN = 1 << 24
MAX_VOCAB_SIZE = 1 << 24
MAX_TENSOR_PARALLEL_SIZE = 1024
