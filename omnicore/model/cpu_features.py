"""What this CPU and this OS let the kernels use: the instruction-set features LLVM compiles
for, Arm's dot product, and Intel's AMX tiles (which Linux grants per process). Plain Python,
asked once by the int8 GEMMs' path choice (`int8_kernels.paths`); no kernel lives here.
"""

from __future__ import annotations

import platform
import sys

from . import jit


def compiler_features() -> set[str]:
    """The CPU features LLVM compiles Numba's code for: NUMBA_CPU_FEATURES where set, else the
    host's (llvmlite's detection; empty where it cannot tell, which leaves the plain path)."""
    jit.start()
    from numba.core import config
    import llvmlite.binding as ll

    feats = config.CPU_FEATURES
    if not feats:
        try:
            feats = ll.get_host_cpu_features().flatten()
        except RuntimeError:
            feats = ""
    return {f[1:] for f in feats.split(",") if f.startswith("+")}


def arm_dotprod(features: set[str]) -> bool:
    """Whether LLVM compiles Arm's dot product for this core. Its host feature detection does not
    map Linux's `asimddp` to `dotprod`, but the core it names (cortex-a76, neoverse-n1, apple-m1,
    ...) brings the feature with it: so the named core, where the kernel reports the unit."""
    if "dotprod" in features:
        return True
    from numba.core import config
    import llvmlite.binding as ll

    name = config.CPU_NAME or ll.get_host_cpu_name()
    if name in ("", "generic"):
        return False
    if name.startswith("apple-"):  # every Apple core has it; macOS has no /proc/cpuinfo
        return True
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            info = f.read()
    except OSError:
        return False
    return any(line.startswith("Features") and "asimddp" in line.split() for line in info.splitlines())


_amx_granted: bool | None = None


def amx_permitted() -> bool:
    """Whether this process may use AMX tiles: Linux hands them out on request
    (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); without it the first tile
    instruction is a SIGILL. Asked once; a refusal (an old kernel, a signal stack too small
    for the tile state, another OS) leaves AMX out."""
    global _amx_granted
    if _amx_granted is None:
        _amx_granted = False
        if sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64"):
            import ctypes

            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _amx_granted = libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl
            except (OSError, AttributeError):
                pass
    return _amx_granted
