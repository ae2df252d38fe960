"""The project's native operators: the int8 GEMV (int8_gemv.c) and the decode step's row attention
(native_ops.cpp), built into one torch operator library.

Registered with torch's dispatcher (`torch.ops.viasd.w8a8_gemv`, `torch.ops.viasd.attend`), so
that a compiled graph calls them from C++ with no Python around each call (compiled.py).

Built on first use into the project's cache, once per source, compiler and torch installation (about
25 s): the C kernel with `$CC` (else `cc`), the operators with `$CXX` (else `c++`) against torch's
headers. Where the CPU is not x86-64 with AVX2 and FMA, or there is no compiler, or the build
fails, `load()` says why (one log line) and callers use their Python paths: fbgemm for every int8
product, the row attention in Python.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

from .offline import cache_root

logger = logging.getLogger(__name__)

_HERE = Path(__file__).parent
SOURCES = (
    _HERE / "int8_gemv.c",
    _HERE / "int4_gemv.c",
    _HERE / "int8_gemv.h",
    _HERE / "int4_gemv.h",
    _HERE / "native_ops.cpp",
)
# -ffp-contract=off: the kernel's float epilogue must round as fbgemm's does (int8_gemv.c).
C_FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-fPIC")
CXX_FLAGS = ("-O2", "-std=c++20", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")


def cpu_unsupported() -> str | None:
    """Why this CPU cannot run the kernel, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"a {platform.machine()} CPU, not x86-64"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"torch reports CPU capability {capability}, not AVX2"
    return None


def _run(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def library_path() -> Path:
    """The operator library, compiled into the cache unless it is there."""
    cc, cxx = os.environ.get("CC", "cc"), os.environ.get("CXX", "c++")
    identity = [s.read_text() for s in SOURCES] + [_run([c, "--version"]) for c in (cc, cxx)]
    # torch's own folder too: the library links against it (and finds it through its rpath)
    identity += [*C_FLAGS, *CXX_FLAGS, torch.__version__, *cpp_extension.library_paths()]
    key = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
    path = cache_root() / "kernels" / f"viasd_ops-{key}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    torch_lib = cpp_extension.library_paths()[0]
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    with tempfile.TemporaryDirectory(dir=path.parent) as work:
        kernels, ops, built = [], str(Path(work) / "native_ops.o"), str(Path(work) / "ops.so")
        for source in SOURCES:
            if source.suffix == ".c":
                kernels.append(str(Path(work) / f"{source.stem}.o"))
                _run([cc, *C_FLAGS, "-c", str(source), "-o", kernels[-1]])
            elif source.suffix == ".cpp":
                _run([cxx, *CXX_FLAGS, *includes, "-c", str(source), "-o", ops])
        _run([cxx, "-shared", "-fopenmp", ops, *kernels, f"-L{torch_lib}", "-ltorch", "-ltorch_cpu", "-lc10",
              f"-Wl,-rpath,{torch_lib}", "-o", built])  # fmt: skip
        os.replace(built, path)  # whole or not at all: another process may be building it too
    logger.info("built the native operators in %.1f s: %s", time.perf_counter() - start, path)
    return path


@functools.cache
def load() -> str | None:
    """Load the operators (building them first if needed); None, or why they are not available
    (logged once)."""
    reason = cpu_unsupported()
    if reason is None:
        try:
            torch.ops.load_library(str(library_path()))
            return None
        except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
            detail = getattr(err, "stderr", None) or err
            reason = f"they could not be built or loaded ({str(detail).strip()[:300]})"
    logger.warning(
        "native operators not used: %s; fbgemm serves every int8 product and the row attention runs in Python",
        reason,
    )
    return reason
