"""What machine a figure was measured on: the CPU's model name and the instruction sets that
decide which kernels torch can use (AMX tiles, AVX-512, AVX2), and how the clock is read."""

from __future__ import annotations

import hashlib
import os
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")

# /proc/cpuinfo flag -> the instruction set it names, fastest matrix path first.
ISA_FLAGS = {
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
    "avx512_bf16": "AVX512-BF16",
    "avx512f": "AVX-512",
    "avx2": "AVX2",
}

# Environment variables that keep a library's kernels below what the CPU has (how an AVX2-only CPU
# is emulated on a newer one): a figure measured under them is not the CPU's own.
ISA_LIMITS = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "FBGEMM_ENABLE_INSTRUCTIONS",
)


@dataclass(frozen=True)
class CpuInfo:
    """The CPU a process runs on."""

    model: str  # "model name" of /proc/cpuinfo (platform.processor() elsewhere)
    isa: tuple[str, ...]  # the matrix-relevant instruction sets present, names of ISA_FLAGS
    logical_cores: int  # cores this process may run on (its affinity mask)
    limits: tuple[str, ...] = ()  # "VAR=value" of the ISA_LIMITS set in the environment

    @property
    def isa_label(self) -> str:
        """'AMX-BF16, AMX-INT8, AVX-512, AVX2' or 'no AVX2' when none of them is there."""
        return ", ".join(self.isa) or "no AVX2"

    @property
    def label(self) -> str:
        """One line for table titles: 'Intel(R) Xeon(R) Processor (AMX-BF16, ..., AVX2; 2 cores)',
        with the kernel limits in force ('...; 2 cores; kernels limited: ATEN_CPU_CAPABILITY=avx2')."""
        limits = f"; kernels limited: {' '.join(self.limits)}" if self.limits else ""
        return f"{self.model} ({self.isa_label}; {self.logical_cores} cores{limits})"

    @property
    def slug(self) -> str:
        """A file name for this CPU: its model and best ISA ('intel-r-xeon-r-processor-amx'), and
        a digest of the kernel limits in force, so that an emulated CPU never shares the real one's files."""
        best = next(
            (tag for tag in ("amx", "avx512", "avx2") if any(tag in i.lower().replace("-", "") for i in self.isa)),
            "base",
        )
        name = re.sub(r"[^a-z0-9]+", "-", self.model.lower()).strip("-") or "cpu"
        if not self.limits:
            return f"{name}-{best}"
        return f"{name}-{best}-limited-{hashlib.sha256(' '.join(self.limits).encode()).hexdigest()[:8]}"

    @property
    def native_bf16(self) -> bool:
        """Whether torch multiplies bf16 in hardware here (AVX512-BF16 or AMX), no kernel limit in force."""
        return not self.limits and bool({"AVX512-BF16", "AMX-BF16"} & set(self.isa))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["isa"] = list(self.isa)
        return out


def parse_cpuinfo(text: str) -> tuple[str | None, set[str]]:
    """(model name, flags) of the first processor block of a /proc/cpuinfo text. A name without a
    model number (what hypervisors often show: 'AMD EPYC') gets the CPU's family and model numbers,
    which tell its generation: 'AMD EPYC (family 25, model 17)'."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if not key and fields:  # the end of the first processor block
            break
        fields.setdefault(key, value.strip())
    model = fields.get("model name")
    if model and not any(c.isdigit() for c in model) and "cpu family" in fields and "model" in fields:
        model = f"{model} (family {fields['cpu family']}, model {fields['model']})"
    return model, set(fields.get("flags", "").split())


def cpu_info(cpuinfo_text: str | None = None, environ: dict[str, str] | None = None) -> CpuInfo:
    """This machine's CPU (or the one described by `cpuinfo_text`, a /proc/cpuinfo text), with
    the kernel limits of this process's environment (or of `environ`)."""
    environ = os.environ if environ is None else environ
    if cpuinfo_text is None:
        try:
            cpuinfo_text = CPUINFO.read_text()
        except OSError:
            cpuinfo_text = ""
    model, flags = parse_cpuinfo(cpuinfo_text)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return CpuInfo(
        model=model or platform.processor() or platform.machine() or "unknown CPU",
        isa=tuple(name for flag, name in ISA_FLAGS.items() if flag in flags),
        logical_cores=cores,
        limits=tuple(f"{var}={environ[var]}" for var in ISA_LIMITS if environ.get(var)),
    )


def device_label(device: torch.device | str) -> str:
    """The compute device a figure ran on: the CPU's label, or the accelerator's name."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return cpu_info().label


def synchronize(device: torch.device | str) -> None:
    """Wait for queued work on `device` (a no-op on CPU): call before reading a clock."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu" and hasattr(torch, "xpu"):
        torch.xpu.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
