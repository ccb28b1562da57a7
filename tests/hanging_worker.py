"""A test tool, not a fake of anything shipped: a real worker (`python -m worker_svc`, the same
flags after --hang-s) whose step hangs for --hang-s seconds the first time a plan starts a
request whose prompt begins with HANG_MARKER, while its heartbeat thread goes on beating
(time.sleep releases the GIL, as a kernel waiting on a wedged device does): a worker the
scheduler still hears from but gets no answer from. It says so on stderr when it hangs.

    python -m tests.hanging_worker --hang-s 10 --scheduler tcp://... --model micro-llama ...
"""
import sys
import time

from worker_svc import __main__ as worker_main
from worker_svc.runner import ModelRunner

HANG_MARKER = [997, 998, 999]


def main() -> int:
    assert sys.argv[1] == "--hang-s", "usage: --hang-s S, then the worker's flags"
    hang_s, worker_argv = float(sys.argv[2]), sys.argv[3:]
    execute, hung = ModelRunner.execute, []

    def execute_or_hang(runner, plan):
        if not hung and any(new.token_ids[:len(HANG_MARKER)] == HANG_MARKER for new in plan.new_requests):
            hung.append(plan.step_id)
            print(f"hanging in step {plan.step_id} for {hang_s} s", file=sys.stderr, flush=True)
            time.sleep(hang_s)
        return execute(runner, plan)

    ModelRunner.execute = execute_or_hang
    return worker_main.main(worker_argv)


if __name__ == "__main__":
    sys.exit(main())
