"""What the package says about itself: its version, what each extra installs, and that the SDK
runs without torch (and without Ray)."""
import re
import subprocess
import sys
from importlib.metadata import requires, version

import pytest

from stepserve import launcher


def test_stepserve_version_is_the_installed_distributions():
    out = subprocess.run([sys.executable, "-m", "stepserve.cli", "--version"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == f"stepserve {version('stepserve')}"


# As a client-only install: the server extra's packages cannot be imported.
_WITHOUT_THE_SERVER_EXTRA = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "safetensors", "fastapi", "uvicorn", "xgrammar", "transformers"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NotInstalled())
"""


def test_the_sdk_imports_neither_torch_nor_the_server():
    code = _WITHOUT_THE_SERVER_EXTRA + (
        "import client_sdk\n"
        "from client_sdk import AsyncClient, Client, SamplingParams\n"
        "loaded = {m.split('.')[0] for m in sys.modules} & {'torch', 'gateway_svc', 'worker_svc', 'stepserve'}\n"
        "assert not loaded, f'import client_sdk imported {sorted(loaded)}'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_cli_runs_its_client_commands_without_the_server_extra():
    code = _WITHOUT_THE_SERVER_EXTRA + (
        "from stepserve.cli import main\n"
        "assert main(['health', '--address', 'tcp://127.0.0.1:9', '--timeout', '0.2']) == 1\n"
        "assert not {m.split('.')[0] for m in sys.modules} & {'torch', 'fastapi', 'worker_svc'}\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_sdk_and_the_cli_import_no_ray():
    # Ray is an extra: only stepserve.ray_data and `--ray` import it, when used.
    code = ("import sys, client_sdk, stepserve.cli, stepserve.launcher; "
            "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')], 'imported ray'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _requirement_names(extra: str | None) -> set[str]:
    """Names of the installed distribution's requirements: the base ones (extra None) or those
    an extra adds."""
    names = set()
    for line in requires("stepserve"):
        requirement, _, marker = line.partition(";")
        in_extra = f'extra == "{extra}"' in marker if extra else "extra ==" not in marker
        if in_extra:
            names.add(re.split(r"[\s<>=!~\[]", requirement.strip(), maxsplit=1)[0].lower())
    return names


def test_the_base_and_the_client_extra_install_no_torch_and_the_server_extra_does():
    base, client, server = _requirement_names(None), _requirement_names("client"), _requirement_names("server")
    assert {"pyzmq", "msgspec", "tokenizers"} <= base
    assert not {"torch", "safetensors", "fastapi", "uvicorn"} & (base | client)
    assert {"torch", "safetensors", "fastapi", "uvicorn"} <= server
    assert "stepserve" in _requirement_names("test")  # the tests run every process: stepserve[server]


def test_a_cluster_without_the_server_extra_says_what_to_install_and_leaves_nothing_running(monkeypatch):
    # As on a client-only install: the worker's packages cannot be found.
    monkeypatch.setitem(launcher.SERVER_EXTRA_MODULES, "worker_svc", ("torch", "no_such_module_of_stepserve"))
    cluster = launcher.LocalCluster("micro-llama")
    with pytest.raises(launcher.MissingExtra, match=r"no_such_module_of_stepserve.*stepserve\[server\]"):
        cluster.start()
    assert cluster.scheduler is not None and cluster.scheduler.poll() is not None, "the scheduler was left running"
    assert not cluster.worker_procs


def test_up_ray_without_ray_says_what_to_install(monkeypatch, capsys):
    from stepserve import cli
    monkeypatch.setitem(sys.modules, "ray", None)  # as where the extra is not installed: import ray fails
    monkeypatch.delitem(sys.modules, "stepserve.ray_cluster", raising=False)
    assert cli.main(["up", "--ray", "--model", "micro-llama"]) == 2
    assert "stepserve[ray]" in capsys.readouterr().err
