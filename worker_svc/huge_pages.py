"""A CPU model's weights in transparent huge pages: every step streams them all, 4 KiB page after
4 KiB page, and with 2 MiB pages it takes 512 times fewer TLB misses to do it.

The weights are copied once, after loading, into one anonymous mapping advised MADV_HUGEPAGE
(the kernel's `madvise` setting gives huge pages only to memory that asks), and each parameter
then views its part of it. Where the kernel has no transparent huge pages the advice is refused
and the weights stay where they are.
"""
import logging
import mmap

import torch
from torch import nn

log = logging.getLogger(__name__)
ALIGN = 64  # bytes: a cache line, what the kernels' vector loads like
HUGE_PAGE = 2 << 20


def move_weights(model: nn.Module) -> int:
    """Moves the model's CPU parameters into huge pages; the bytes moved (0: left where they were)."""
    params = [p for p in model.parameters() if p.device.type == "cpu" and p.numel()]
    if not params or not hasattr(mmap, "MADV_HUGEPAGE"):
        return 0
    offsets, size = [], 0
    for param in params:
        offsets.append(size)
        size += -(-param.numel() * param.element_size() // ALIGN) * ALIGN
    region = mmap.mmap(-1, (-(-size // HUGE_PAGE) + 1) * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError as exc:  # no transparent huge pages in this kernel
        log.info("weights stay in small pages: %s", exc)
        region.close()
        return 0
    memory = torch.frombuffer(region, dtype=torch.uint8)  # keeps the mapping alive as long as a view of it
    start = -memory.data_ptr() % HUGE_PAGE  # the first whole huge page
    for param, offset in zip(params, offsets):
        offset += start
        nbytes = param.numel() * param.element_size()
        moved = memory[offset:offset + nbytes].view(param.dtype).view(param.shape)
        moved.copy_(param.data)
        param.data = moved
    return size
