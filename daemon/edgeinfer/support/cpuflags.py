"""Whether this CPU runs INT8 models fast: the CPU flags ONNX Runtime's
quantized kernels depend on, read from /proc/cpuinfo.

Without VNNI (x86: avx512_vnni or avx_vnni; AMX: amx_int8) ONNX Runtime's
u8s8 kernels multiply with VPMADDUBSW + VPMADDWD, and many users measure an
INT8 model slower than its FP32 original (onnxruntime #17389, #20052). Used
by `edgeinferctl model quantize`, `model bench` and bench/quantize.py, so all
three say the same thing about a host.
"""
from __future__ import annotations

import dataclasses
import os
import platform

# Read instead of /proc/cpuinfo when set: the test suite runs every INT8 outlook's branch on any CPU with it.
CPUINFO_ENV = "EDGEINFER_CPUINFO"

# The flags that decide INT8 speed on x86, most capable first (printed in this order).
X86_INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512f", "avx2")
# Arm: the dot-product (asimddp) and int8 matrix multiply (i8mm) extensions.
ARM_INT8_FLAGS = ("i8mm", "asimddp")


@dataclasses.dataclass(frozen=True)
class CpuInt8:
    model: str                 # the CPU's model name
    flags: tuple[str, ...]     # the INT8-relevant flags it has (X86_INT8_FLAGS or ARM_INT8_FLAGS order)
    fast_int8: bool            # has an 8-bit dot-product instruction (VNNI, AMX, Arm dot product)
    note: str                  # one plain line: what to expect of INT8 here

    def line(self) -> str:
        return f"CPU: {self.model}; INT8 flags: {' '.join(self.flags) or 'none'}. {self.note}"


def cpuinfo_field(name: str, cpuinfo: str = "/proc/cpuinfo") -> str:
    """The first value of `name` in /proc/cpuinfo (vendor_id, model name, ...); "" if it has none."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def cpu_int8(cpuinfo: str | None = None) -> CpuInt8:
    """The INT8 outlook of this host (of `cpuinfo`, a /proc/cpuinfo text file, or $EDGEINFER_CPUINFO's)."""
    cpuinfo = cpuinfo or os.environ.get(CPUINFO_ENV) or "/proc/cpuinfo"
    model, flags = None, set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model name", "CPU part") and model is None:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass  # not Linux, or no /proc: said below, never guessed
    model = model or platform.machine() or "unknown CPU"
    if not flags:
        return CpuInt8(model, (), False, f"cannot read CPU flags from {cpuinfo}: INT8 speed unknown, measure it "
                                         "with `edgeinferctl model bench`")
    arm = bool(flags & set(ARM_INT8_FLAGS)) or "asimd" in flags
    order = ARM_INT8_FLAGS if arm else X86_INT8_FLAGS
    have = tuple(f for f in order if f in flags)
    fast = bool(set(have) & {"amx_int8", "avx512_vnni", "avx_vnni", "asimddp", "i8mm"})
    if fast:
        note = "It has an 8-bit dot-product instruction: INT8 is likely faster than FP32 (measure it)."
    else:
        note = ("No VNNI/AMX (or Arm dot product): INT8 is likely SLOWER than FP32 on this CPU "
                "(onnxruntime #17389, #20052); keep FP32 here unless `model bench` shows otherwise.")
    return CpuInt8(model, have, fast, note)
