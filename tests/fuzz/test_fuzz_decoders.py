"""The coverage-guided fuzz of every decoder (tests/fuzz_decoders.py), bounded: 200,000 inputs
from the seed corpus of valid messages. A crash (any exception but the decoder's own error, or a
message that does not survive re-encoding) fails it with libFuzzer's report and the input."""
import subprocess
import sys


def test_fuzzing_every_decoder_finds_no_crash(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tests.fuzz_decoders", "-runs=200000", "-seed=7",
                          f"-artifact_prefix={tmp_path}/"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "Done 200000 runs" in out.stderr
