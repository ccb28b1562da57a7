"""What the package says about itself: its version, and that the SDK runs without torch."""
import subprocess
import sys
from importlib.metadata import version


def test_stepserve_version_is_the_installed_distributions():
    out = subprocess.run([sys.executable, "-m", "client_sdk.cli", "--version"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == f"stepserve {version('stepserve')}"


def test_the_sdk_imports_no_torch():
    code = "import sys, client_sdk; assert 'torch' not in sys.modules, 'client_sdk imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
