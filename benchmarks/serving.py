"""`python -m benchmarks.serving`, kept for scripts that call it: the benchmark is
client_sdk/bench/serving.py (`stepserve bench serve`)."""
import sys

from client_sdk.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "serve", *sys.argv[1:]]))
