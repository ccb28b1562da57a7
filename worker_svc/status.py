"""Status lines a worker prints on stdout while it starts (what takes long, and why), for the
process that launched it to relay to its user: stepserve/process_output.py's WORKER_STATUS
reads them. The log (stderr) keeps the details."""


def say(message: str) -> None:
    print(f"stepserve worker: {message}", flush=True)
