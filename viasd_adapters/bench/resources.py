"""Memory, CPU-time and CPU-load probes around one generation (what each benchmark record notes)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import psutil
import torch

from ..hardware import synchronize

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux >= 4.0); False if impossible."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    """VmHWM (peak RSS since the last reset) when /proc has it, else the lifetime ru_maxrss."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def cpu_seconds(process: psutil.Process) -> float:
    """CPU time (user + system) used so far by `process`, its reaped children and its live
    descendants (a draft worker process is one)."""
    t = process.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in process.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.NoSuchProcess:  # ended between the listing and the reading
            continue
        total += c.user + c.system
    return total


class ResourceProbe:
    """Measures one interval: peak memory, CPU time, and the CPU load of this process and the machine.

    `start()` then `stop() -> dict`; the dict goes into the benchmark record as is.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.process = psutil.Process()
        self.cpu_count = psutil.cpu_count() or 1

    def start(self) -> None:
        self.peak_scope = "generation" if _reset_peak_rss() else "process"
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        psutil.cpu_percent(interval=None)  # starts the machine-wide CPU-time interval
        self.cpu_times = self.process.cpu_times()
        self.cpu_seconds = cpu_seconds(self.process)
        self.loadavg_start = os.getloadavg()[0]
        synchronize(self.device)
        self.begin = time.perf_counter()

    def stop(self) -> dict:
        synchronize(self.device)
        wall = time.perf_counter() - self.begin
        after = self.process.cpu_times()
        used = (after.user - self.cpu_times.user) + (after.system - self.cpu_times.system)
        total = cpu_seconds(self.process) - self.cpu_seconds
        record = {
            "peak_rss_mb": _peak_rss_mb(),
            "peak_rss_scope": self.peak_scope,  # "generation": reset before it; "process": lifetime
            "rss_mb": self.process.memory_info().rss / 2**20,
            # 100 % is one core fully busy; the process can reach cpu_count * 100.
            "process_cpu_percent": 100.0 * used / wall if wall > 0 else 0.0,
            # CPU time of this process and its children (a draft worker) during the interval,
            # and the cores that keeps busy on average (cpu_seconds / wall).
            "cpu_seconds": total,
            "cores_busy": total / wall if wall > 0 else 0.0,
            # 0-100 over all cores: what this process and everything else on the machine used.
            "system_cpu_percent": psutil.cpu_percent(interval=None),
            "loadavg_1m_start": self.loadavg_start,
            "loadavg_1m_end": os.getloadavg()[0],
            "cpu_count": self.cpu_count,
        }
        if self.device.type == "cuda":
            record["cuda_peak_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return record
