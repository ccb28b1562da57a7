"""The event loop every stepserve process runs: uvloop where it installs (not on Windows),
asyncio's own elsewhere."""
import asyncio

try:
    import uvloop
except ImportError:  # pyproject.toml installs it only where it builds
    uvloop = None


def run(main):
    """Runs the coroutine main to completion, on uvloop when available."""
    if uvloop is not None:
        return uvloop.run(main)
    return asyncio.run(main)
