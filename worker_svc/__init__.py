"""stepserve model worker: loads a model, holds its paged KV cache and Mamba state, and runs
the scheduler's step plans (runner.ModelRunner); service.py wraps it in the ZeroMQ loop."""
