"""`python -m benchmarks.throughput`, kept for scripts that call it: the benchmark is
client_sdk/bench/throughput.py (`stepserve bench throughput`)."""
import sys

from client_sdk.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "throughput", *sys.argv[1:]]))
