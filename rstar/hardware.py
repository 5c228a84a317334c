"""What this machine can compute fast, read once: CPU model and flags, and whether bf16 is native.

Machines of one kind differ: an AMD Zen 4/5 with AVX512_BF16 runs bf16 matmuls at several times fp32's speed,
while an Intel Xeon with AVX-512 but without AVX512_BF16 emulates bf16 and runs it several times *slower* than fp32.
Defaults that depend on this (the trainer's compute dtype, the engine's dtype) are chosen from these facts,
never from what was fastest on one machine, and every benchmark records them.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import asdict, dataclass

# Flags that mean bf16 matrix arithmetic in hardware (x86: AVX512_BF16 or AMX; Arm: the BF16 extension).
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# Flags worth recording beside a benchmark's figures.
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "bf16", "asimd", "sve")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    cores: int  # usable by this process
    flags: tuple[str, ...]  # the REPORTED_FLAGS this CPU has

    @property
    def native_bf16(self) -> bool:
        return any(flag in self.flags for flag in BF16_FLAGS)

    def to_dict(self) -> dict:
        return asdict(self) | {"native_bf16": self.native_bf16}


def _cpuinfo_fields() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the first processor's block describes them all here
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


@functools.cache
def cpu_info() -> CpuInfo:
    fields = _cpuinfo_fields()
    all_flags = set((fields.get("flags") or fields.get("Features") or "").split())
    model = fields.get("model name") or fields.get("Model") or platform.processor() or platform.machine()
    return CpuInfo(model=model, cores=len(usable_cores()), flags=tuple(flag for flag in REPORTED_FLAGS if flag in all_flags))


def usable_cores() -> list[int]:
    """The ids of the cores this process may run on (its affinity), in order."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def accelerator() -> str:
    """'cuda' (NVIDIA or ROCm through torch.cuda) or 'cpu'; torch is optional for this check."""
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def fast_dtype() -> tuple[str, str]:
    """The compute dtype that runs fastest here, and why (see `fast_dtype_for`)."""
    return fast_dtype_for(accelerator(), cpu_info())


def fast_dtype_for(accelerator_kind: str, cpu: CpuInfo) -> tuple[str, str]:
    """bf16 on GPUs and on CPUs with native bf16, else fp32; with the reason."""
    if accelerator_kind == "cuda":
        return "bfloat16", "a GPU"
    if cpu.native_bf16:
        native = next(flag for flag in BF16_FLAGS if flag in cpu.flags)
        return "bfloat16", f"the CPU has {native}"
    return "float32", "the CPU has no native bf16 (AVX512_BF16/AMX), where bf16 is emulated and several times slower"
