"""A batch job's files: the input read line by line and the output appended line by line,
either gzip-compressed when its name ends in .gz, and an output left by a job that died read
back for a resume.

Each output line is written through to the OS as it comes, so a killed job loses at most what
was in flight, plus at worst the line being written: a torn last line (or a gzip member cut
short) is dropped when the job resumes, and its request runs again. A write that finds the
disk full leaves no torn line: the file is cut back to its last whole line and DiskFull is
raised. A .gz output is a whole gzip after every line: each line is written with its member's
end after it, and the next line overwrites that end, so a full disk never needs room to end it.
"""
import contextlib
import gzip
import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterator

import msgspec

from gateway_svc.disk_full import DiskFull, is_disk_full

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
    """Appends output lines, each written through to the OS as it comes (a .gz file's member
    sync-flushed after each)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._whole_size = os.fstat(self._fd).st_size  # where the last whole line ends (a member's end apart)
        self._member = _GzipMember() if _is_gzip(path) else None

    def write(self, obj: dict) -> None:
        line = _encoder.encode(obj) + b"\n"
        if self._member is None:
            self._write(line, b"")
            return
        data = self._member.compress(line)
        self._write(data, self._member.end_with(line))
        self._member.add_whole(line)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # a .gz member is already ended after its last line
            self._fd = -1

    def _write(self, data: bytes, end: bytes) -> None:
        """data and then end at the last whole line's end (over the end written after it), or
        the file cut back to its last whole line (and end) and closed, and the error raised
        (DiskFull when there was no space)."""
        try:
            _write_all_at(self._fd, data + end, self._whole_size)
        except OSError as e:
            self._cut_back()
            if is_disk_full(e):
                raise DiskFull(self.path) from e
            raise
        self._whole_size += len(data)

    def _cut_back(self) -> None:
        end = self._member.end_after_whole_lines() if self._member and self._member.num_bytes else b""
        # The bytes the last end took are still the file's: writing it again there takes no space.
        with contextlib.suppress(OSError):
            _write_all_at(self._fd, end, self._whole_size)
        os.ftruncate(self._fd, self._whole_size + len(end))
        self.close()


def _write_all_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


# A final deflate block holding nothing (BFINAL=1, fixed codes, end of block; RFC 1951): after a
# sync flush it ends the deflate stream where the last whole line ended.
_EMPTY_FINAL_BLOCK = b"\x03\x00"


class _GzipMember:
    """One gzip member written a line at a time, each line sync-flushed, and the CRC and size
    of the lines written whole, so the member can be ended after them if a later line fails."""

    def __init__(self):
        self._compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip's header and trailer
        self._crc = 0
        self.num_bytes = 0  # of the lines written whole

    def compress(self, line: bytes) -> bytes:
        return self._compressor.compress(line) + self._compressor.flush(zlib.Z_SYNC_FLUSH)

    def add_whole(self, line: bytes) -> None:
        self._crc = zlib.crc32(line, self._crc)
        self.num_bytes += len(line)

    def end_after_whole_lines(self) -> bytes:
        return _EMPTY_FINAL_BLOCK + struct.pack("<II", self._crc, self.num_bytes & 0xFFFFFFFF)

    def end_with(self, line: bytes) -> bytes:
        """The member's end once `line` too is whole."""
        return _EMPTY_FINAL_BLOCK + struct.pack("<II", zlib.crc32(line, self._crc),
                                                (self.num_bytes + len(line)) & 0xFFFFFFFF)


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
    try:
        with gzip.open(path, "rb") as src, gzip.open(tmp, "wb") as dst:
            for _ in range(num_lines):
                dst.write(src.readline())
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)  # the output stays as it was
        if is_disk_full(e):
            raise DiskFull(tmp) from e
        raise
    os.replace(tmp, path)
