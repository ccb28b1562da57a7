"""The scheduler process: the sans-IO scheduler core and, around it, the ZMQ/asyncio service.

Import-light on purpose: the core imports neither torch nor asyncio, so that it can be unit
tested, fuzzed and micro-benchmarked alone. Import the pieces from their modules.

Where a step happens: ReplicaDriver (step_loop.py), one loop per replica:
    refill its core from `pending`  ->  plan = core.schedule()  ->  send the plan to the worker
    ->  await its StepResult  ->  core.update(plan, result)  ->  outputs to the clients.
What schedule() decides (budgets, preemption, prefix caching, two plans in flight) is the core's
docstring (scheduler.py); where a live request is: request_book.py.
"""
