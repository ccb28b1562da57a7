"""The scheduler process: the sans-IO scheduler core and, around it, the ZMQ/asyncio service.

Import-light on purpose: the core imports neither torch nor asyncio, so that it can be unit
tested, fuzzed and micro-benchmarked alone. Import the pieces from their modules.
"""
