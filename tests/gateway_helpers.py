"""Test tools for the HTTP gateway: gateways on a started cluster, curl, Prometheus text,
server-sent events."""
import json
import subprocess

from prometheus_client.parser import text_string_to_metric_families


def start_gateways(cluster, *gateway_args: list[str]) -> list[str]:
    """One gateway per argument list on a started LocalCluster, once a worker has joined; their URLs."""
    from client_sdk import Client
    urls = [cluster.start_gateway(args) for args in gateway_args]
    with Client(cluster.address, timeout_s=60) as client:
        cluster.wait_for_workers(client, 1)
    return urls


def curl(*args: str, timeout_s: float = 60) -> tuple[int, str]:
    """(HTTP status, body) of a curl call."""
    out = subprocess.run(["curl", "-sS", "-N", "-w", "\n%{http_code}", *args], capture_output=True, text=True,
                         timeout=timeout_s)
    assert out.returncode == 0, out.stderr
    body, _, status = out.stdout.rpartition("\n")
    return int(status), body


def post_json(url: str, body: dict, *headers: str) -> tuple[int, str]:
    header_args = [a for h in headers for a in ("-H", h)]
    return curl(url, "-H", "Content-Type: application/json", *header_args, "-d", json.dumps(body))


def sse_events(body: str) -> list[str]:
    """The data of each server-sent event, in order."""
    return [block[len("data: "):] for block in body.split("\n\n") if block.startswith("data: ")]


def metric_samples(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text -> {(sample name, sorted labels): value}; parsed by prometheus_client."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
