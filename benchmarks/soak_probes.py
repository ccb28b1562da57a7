"""What the soak watches in its processes: resident memory and open descriptors sampled from
/proc, their growth after a warm-up, and the ERROR lines of their logs, told apart from those
the soak's own faults explain."""
import os
import re
import subprocess
import time
from dataclasses import dataclass, field

# A log line at ERROR or worse: our processes' format ("... name ERROR message"), uvicorn's
# ("ERROR: ..."), a traceback, and what asyncio and the interpreter say of exceptions nobody
# retrieved (the send_abort of issue 37 printed one of these).
ERROR_LINE = re.compile(r" (ERROR|CRITICAL) |^(ERROR|CRITICAL):|^Traceback |Task exception was never retrieved|"
                        r"^Exception ignored")
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
# Descriptors come and go with connections: growth counts past this many, as well as past the bound.
MIN_FD_GROWTH = 5


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def num_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


@dataclass
class Watched:
    """One process: its name, log, and samples (time, RSS MiB, descriptors)."""
    name: str
    proc: subprocess.Popen
    log_fd: int | None = None  # read with pread: the child shares the file's offset
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    ended: bool = False  # killed on purpose, or exited

    @property
    def pid(self) -> int:
        return self.proc.pid

    def sample(self, now: float) -> None:
        rss, fds = rss_mb(self.pid), num_fds(self.pid)
        if rss is None or fds is None:
            self.ended = True
        elif not self.ended:
            self.samples.append((now, rss, fds))

    def growth(self, warmup_s: float, end_t: float) -> dict:
        """RSS and descriptors at the first sample after its warm-up against its last one up to
        end_t; 'young' when it has not lived long enough to have both, or did not live to the end."""
        row = {"name": self.name, "pid": self.pid, "ended": self.ended}
        if not self.samples or self.ended:  # killed on purpose: it did not live to the end
            return {**row, "young": True}
        first = self.samples[0][0]
        base = next((s for s in self.samples if s[0] >= first + warmup_s), None)
        end = next((s for s in reversed(self.samples) if s[0] <= end_t), None)
        if base is None or end is None or end[0] - base[0] < warmup_s / 2:
            return {**row, "young": True}
        return {**row, "young": False, "rss_mb_base": round(base[1], 1), "rss_mb_end": round(end[1], 1),
                "rss_growth": round(end[1] / base[1] - 1, 4), "fds_base": base[2], "fds_end": end[2],
                "fds_growth": round(end[2] / base[2] - 1, 4), "rss_mb_peak": round(max(s[1] for s in self.samples), 1),
                "series": [(round(t - first, 1), round(rss, 1), fds) for t, rss, fds in self.samples]}

    def log_lines(self) -> list[str]:
        if self.log_fd is None:
            return []
        chunks, offset = [], 0
        while chunk := os.pread(self.log_fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode(errors="replace").splitlines()


def grew_too_much(row: dict, bound: float) -> bool:
    if row["young"]:
        return False
    return row["rss_growth"] > bound or (row["fds_growth"] > bound and row["fds_end"] - row["fds_base"] >= MIN_FD_GROWTH)


def log_time(line: str) -> float | None:
    """The epoch time of a log line of our format, or None."""
    match = _LOG_TIME.match(line)
    if not match:
        return None
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000


def error_lines(watched: list[Watched], faults: list[dict], explained: dict[str, list[re.Pattern]],
                window_s: float) -> tuple[list[str], list[str]]:
    """(lines a fault explains, the others). A line is explained when it matches a pattern of a
    fault's kind and was logged within window_s after that fault (a line without a time: after
    any fault of that kind); a traceback's lines go with the line that opened it."""
    injected, unexpected = [], []
    for proc in watched:
        lines = proc.log_lines()
        for i, line in enumerate(lines):
            if not ERROR_LINE.search(line):
                continue
            if line.startswith("Traceback") and i and ERROR_LINE.search(lines[i - 1]):
                continue  # the traceback of the line before (logger.exception): counted with it
            context = "\n".join([line, *_continuation(lines, i + 1)])
            when = log_time(line)
            fits = any(pattern.search(context) and (when is None or 0 <= when - fault["t"] <= window_s)
                       for fault in faults for pattern in explained.get(fault["kind"], ()))
            (injected if fits else unexpected).append(f"{proc.name}: {context}"[:2000])
    return injected, unexpected


def _continuation(lines: list[str], start: int, limit: int = 60) -> list[str]:
    """The lines after a log line that belong to it (a traceback): up to the next timed line."""
    out = []
    for line in lines[start:start + limit]:
        if _LOG_TIME.match(line):
            break
        out.append(line)
    return out
