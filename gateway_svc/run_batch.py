"""`stepserve run-batch -i IN.jsonl -o OUT.jsonl` (its flags and its local cluster: stepserve/cli.py): an
OpenAI batch file run to its output file on a scheduler's address.

The output is appended line by line as requests finish; `--resume` reads the output of a job
that died, drops a torn last line and runs only the lines it lacks. On a terminal a progress
bar shows requests/s, tokens/s (prompt tokens, and completion tokens when any were generated)
and the time left; a summary line ends the run. Exit status 0
when every input line has its output line. A disk that fills ends the job with one line naming
the path (exit status 1); the output keeps its whole lines, for a --resume once there is space.
"""
import argparse
import sys
import time

from client_sdk.client import AsyncClient
from gateway_svc.batch_files import OutputFile, read_finished, read_lines
from gateway_svc.batch_runner import BatchCounts, BatchRunner
from gateway_svc.disk_full import DiskFull, disk_full_named
from gateway_svc.chat_parsing import chat_parsing_of
from gateway_svc.upstream import Upstream


class _Progress:
    """A tqdm bar on a terminal: requests/s, tokens/s and, with a known total, the time left."""

    def __init__(self, total: int | None):
        from tqdm import tqdm
        self._bar = tqdm(total=total, unit="req", dynamic_ncols=True, file=sys.stderr)
        self._last_postfix = 0.0

    def __call__(self, counts: BatchCounts, ok: bool) -> None:
        self._bar.update(1)
        now = time.monotonic()
        if now - self._last_postfix > 0.5:
            self._last_postfix = now
            self._bar.set_postfix_str(f"{token_rates(counts, now - counts.started)}, {counts.num_failed} failed",
                                      refresh=False)

    def close(self) -> None:
        self._bar.close()


def token_rates(counts: BatchCounts, elapsed: float) -> str:
    """Prompt tokens/s, and completion tokens/s when any were generated (embedding lines have none)."""
    rates = f"{counts.num_prompt_tokens / elapsed:.1f} prompt tokens/s"
    if counts.num_completion_tokens:
        rates += f", {counts.num_completion_tokens / elapsed:.1f} completion tokens/s"
    return rates


def _num_lines(path: str) -> int:
    return sum(1 for line in read_lines(path) if line.strip())


async def run(args: argparse.Namespace, address: str) -> int:
    keys = {}
    if getattr(args, "curve_keys", None) and args.address is None:
        keys = {"curve_server_key": f"{args.curve_keys}/scheduler.key",
                "curve_secret_key": f"{args.curve_keys}/client.key_secret"}
    async with AsyncClient(address, timeout_s=60, **keys) as client:
        await client.wait_for_workers(1, timeout_s=600)
        upstream = Upstream(client, args.served_model_name, chat_parsing=chat_parsing_of(args))
        progress = _Progress(_num_lines(args.input_file)) if sys.stderr.isatty() else None
        out = None
        num_before = 0
        runner = BatchRunner(upstream, lambda line: out.write(line), window=args.window,
                             min_priority=args.priority, on_line=progress or (lambda counts, ok: None))
        try:
            with disk_full_named(args.output_file):
                if args.resume:
                    num_before = read_finished(args.output_file, runner.mark_done)
                out = OutputFile(args.output_file) if args.resume else _fresh(args.output_file)
                counts = await runner.run(read_lines(args.input_file))
        except DiskFull as full:
            print(f"run-batch: {full}; the output keeps its {num_before + runner.counts.num_done} whole lines: "
                  "run it again with --resume once there is space", file=sys.stderr, flush=True)
            return 1
        finally:
            if out is not None:
                out.close()
            if progress is not None:
                progress.close()
    elapsed = time.monotonic() - counts.started
    print(f"run-batch: {counts.num_completed} completed, {counts.num_failed} failed, {counts.num_skipped} done "
          f"before, in {elapsed:.1f} s ({counts.num_done / elapsed:.1f} requests/s, {token_rates(counts, elapsed)}) "
          f"-> {args.output_file}", flush=True)
    return 0 if counts.num_done + counts.num_skipped == counts.num_lines else 1


def _fresh(path: str) -> OutputFile:
    open(path, "wb").close()  # a new job replaces an old output (--resume keeps it)
    return OutputFile(path)
