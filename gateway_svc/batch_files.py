"""A batch job's files: the input read line by line and the output appended line by line,
either gzip-compressed when its name ends in .gz, and an output left by a job that died read
back for a resume.

Each output line is flushed as it is written, so a killed job loses at most what was in
flight, plus at worst the line being written: a torn last line (or a gzip member cut short)
is dropped when the job resumes, and its request runs again.
"""
import gzip
import logging
import os
import zlib
from collections.abc import Callable, Iterator

import msgspec

logger = logging.getLogger("stepserve.batch")
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def _is_gzip(path: str) -> bool:
    return str(path).endswith(".gz")


def read_lines(path: str) -> Iterator[bytes]:
    """The input's lines, read lazily."""
    with (gzip.open(path, "rb") if _is_gzip(path) else open(path, "rb")) as f:
        yield from f


class OutputFile:
    """Appends output lines, each flushed to the OS as it is written."""

    def __init__(self, path: str):
        self.path = path
        self._file = gzip.open(path, "ab") if _is_gzip(path) else open(path, "ab")

    def write(self, obj: dict) -> None:
        self._file.write(_encoder.encode(obj) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_finished(path: str, on_output: Callable[[dict], None]) -> int:
    """Calls on_output with each whole line of an existing output file and returns how many;
    a torn last line (the job died while writing it) is cut off the file."""
    if not os.path.exists(path):
        return 0
    num_lines = 0
    torn = False
    offset = 0
    opened = gzip.open(path, "rb") if _is_gzip(path) else open(path, "rb")
    with opened as f:
        try:
            for line in f:
                if not line.endswith(b"\n"):
                    torn = True
                    break
                try:
                    on_output(_decoder.decode(line))
                except msgspec.DecodeError:  # a whole line that is not JSON: not ours to judge, kept
                    logger.warning("line %d of %s is not JSON; kept, not counted as done", num_lines + 1, path)
                num_lines += 1
                offset += len(line)
        except (EOFError, gzip.BadGzipFile, zlib.error):
            torn = True  # a gzip member cut short: what it held up to its last whole line is kept
    if torn:
        _truncate(path, offset, num_lines)
    return num_lines


def _truncate(path: str, offset: int, num_lines: int) -> None:
    if not _is_gzip(path):
        with open(path, "r+b") as f:
            f.truncate(offset)
        return
    # A gzip member cut short cannot be appended to: copy the whole lines into a fresh file.
    tmp = path + ".resume-tmp"
    with gzip.open(path, "rb") as src, gzip.open(tmp, "wb") as dst:
        for _ in range(num_lines):
            dst.write(src.readline())
    os.replace(tmp, path)
