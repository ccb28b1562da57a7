"""`stepserve bench throughput` and `stepserve bench serve`: the benchmarks users run, shipped
with the SDK. The repository's benchmarks/ folder holds the ones that compare engines and modes."""
