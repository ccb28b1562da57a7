"""The CPU a figure was measured on: model name, core count and the flags that decide matmul
speed (AVX2, AVX-512, AVX512-BF16, AMX), printed next to every benchmark figure."""
import os

MATMUL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_summary() -> str:
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    present = [flag for flag in MATMUL_FLAGS if flag in flags]
    return f"{model}, {os.cpu_count()} cores, flags: {' '.join(present) or 'none of ' + ','.join(MATMUL_FLAGS)}"
