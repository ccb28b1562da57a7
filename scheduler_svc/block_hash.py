"""Content hashes of full KV blocks, chained so that a block's hash names its whole prefix.

hash(block i) = sha256(hash(block i - 1), the block's token ids, extra keys). The KV of a block
depends on every token before it, so equal hashes mean equal KV: a request may read a block
another request computed. sha256 (not Python's hash()) because a collision would hand out the
wrong KV silently; ~0.5 us per block, once per block of a request.
"""
import hashlib

import msgspec

from scheduler_svc.request import Request

_encode = msgspec.msgpack.Encoder().encode


def hash_block(parent_hash: bytes | None, token_ids: list[int], extra_keys: tuple = ()) -> bytes:
    """extra_keys: whatever else changes the block's KV (an adapter id, multimodal inputs). The
    models served today have none; the block size and the model are fixed per replica, whose
    cache is its own."""
    return hashlib.sha256(_encode((parent_hash, token_ids, extra_keys))).digest()


def block_hash(request: Request, index: int, block_size: int) -> bytes:
    """Hash of the request's full block `index`, memoised on the request. Hashes are computed in
    order as blocks are looked up or filled, so this costs one hash per block of a request over
    its whole life (a preempted request keeps them: its tokens do not change)."""
    hashes = request.block_hashes
    if hashes is None:
        hashes = request.block_hashes = []
    while len(hashes) <= index:
        i = len(hashes)
        assert (i + 1) * block_size <= request.num_tokens, "hash of a block that is not full"
        parent = hashes[i - 1] if i else None
        hashes.append(hash_block(parent, request.token_ids_between(i * block_size, (i + 1) * block_size)))
    return hashes[index]
