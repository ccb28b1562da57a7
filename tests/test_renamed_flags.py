"""Renamed public names keep working, with a warning: the scheduler's --workers ADDRESS (now
--worker-address; `stepserve --workers N` is a count), stepserve's --workers-address and
LocalCluster(workers=...)."""
import pytest

from client_sdk.cli import add_worker_address_flag
from client_sdk.launcher import LocalCluster
from scheduler_svc.__main__ import parse_args


def test_the_scheduler_takes_worker_address_and_the_old_flag_with_a_warning(capsys):
    assert parse_args(["--worker-address", "tcp://127.0.0.1:7001"]).worker_address == "tcp://127.0.0.1:7001"
    assert "deprecated" not in capsys.readouterr().err
    assert parse_args(["--workers", "tcp://127.0.0.1:7002"]).worker_address == "tcp://127.0.0.1:7002"
    assert "--workers ADDRESS is deprecated: use --worker-address" in capsys.readouterr().err


def test_stepserve_takes_worker_address_and_the_old_flag():
    import argparse
    p = argparse.ArgumentParser()
    add_worker_address_flag(p, "tcp://127.0.0.1:*")
    assert p.parse_args([]).worker_address == "tcp://127.0.0.1:*"
    assert p.parse_args(["--workers-address", "tcp://h:1"]).deprecated_workers_address == "tcp://h:1"


def test_local_cluster_takes_workers_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="worker_address"):
        cluster = LocalCluster(workers="tcp://127.0.0.1:7003")
    assert cluster.worker_address == "tcp://127.0.0.1:7003"
    with pytest.warns(DeprecationWarning, match="worker_address"):
        assert cluster.workers_address == "tcp://127.0.0.1:7003"
    assert LocalCluster(worker_address="tcp://127.0.0.1:7004").worker_address == "tcp://127.0.0.1:7004"
