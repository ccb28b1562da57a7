"""Keep Python's cyclic GC from making a step cost proportional to the heap.

With a million waiting requests alive, every full (gen-2) collection walks all of them:
hundreds of milliseconds inside whichever step triggers it. Requests hold no reference
cycles, so refcounting frees them and the cyclic GC never needs to look at them.
"""
import gc

# Young-generation threshold: a step allocates a few thousand short-lived containers; a
# larger gen-0 threshold means fewer (still cheap, heap-independent) young collections.
GEN0_THRESHOLD = 20_000


def tune_gc_for_large_queues() -> None:
    """Move every object alive now out of the collector's sight, and collect young objects less often.

    The service calls this after each bulk admission (a Generate message with many requests)
    and once after start-up. O(1): gc.freeze() splices lists; frozen objects are still freed
    by refcounting when they die, only never scanned by the cyclic collector.
    """
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0 < GEN0_THRESHOLD:
        gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
