"""The engine's defaults, chosen from the hardware at start-up, each with its reason.

Machines of one kind differ (rstar/hardware.py), so nothing here is what was fastest on one machine: each
choice is a pure function of facts read at start-up (accelerator, CPU flags and cores, whether a compile cache
for this model and configuration exists), every `auto` can be overridden, and `describe` puts all of them,
with their reasons, on the one line `rstar serve` logs.

Eager vs compiled: where the CPU vectorizes, compiled generation outruns both eager and `vllm serve`'s
defaults at every concurrency, for a longer first start (benchmarks/README.md has the figures). vLLM's CPU
backend compiles one graph for a dynamic batch shape (torch.compile with inductor's C++ kernels, no CUDA
graphs), and keeps the result under VLLM_CACHE_ROOT, so `auto` compiles and points that root into our cache
dir, one per model and configuration: the second start loads the compiled model instead of compiling again.
No warm-up shapes to trim on CPU, since no CUDA graphs are captured; on GPUs the captured batch sizes are
capped at max_num_seqs, which no decode step exceeds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from rstar.hardware import CpuInfo, fast_dtype_for

# vLLM's own CPU binding keeps one core for its front end. On a machine this small that core is a large share
# of the compute, so every core is bound, sandbox calls sharing them (the gain: benchmarks/README.md).
SMALL_CPU_CORES = 4
# Inductor's CPU kernels are vectorized C++; without one of these the compiled graph has little to win.
VECTOR_FLAGS = ("avx512f", "avx2", "asimd")


@dataclass(frozen=True)
class Choice:
    """One default: what was picked, why, and a warning when an explicit setting costs speed."""

    value: Any
    why: str
    warning: str | None = None


def choose_dtype(setting: str, accelerator_kind: str, cpu: CpuInfo) -> Choice:
    """`auto` follows the hardware; an explicit bf16 where it is emulated is honoured, with a warning naming
    the cost and the better choice."""
    fast, why = fast_dtype_for(accelerator_kind, cpu)
    if setting == "auto":
        return Choice(fast, why)
    warning = None
    if setting in ("bfloat16", "bf16") and fast == "float32":
        warning = (
            f"dtype {setting} was asked for, but this CPU ({cpu.model}) has no native bf16 and emulates it: expect generation "
            "several times slower than with float32 (RSTAR_ENGINE__DTYPE=auto or float32)"
        )
    return Choice(setting, "as configured", warning)


def choose_threads_bind(setting: str, cores: list[int], from_environment: str | None) -> Choice:
    """VLLM_CPU_OMP_THREADS_BIND (None: vLLM's own default). An explicit environment value wins; `auto` binds
    every usable core on small machines and leaves bigger ones to vLLM's NUMA-aware default."""
    if from_environment:
        return Choice(from_environment, "from VLLM_CPU_OMP_THREADS_BIND")
    if setting != "auto":
        return Choice(setting, "as configured")
    contiguous = cores == list(range(cores[0], cores[-1] + 1))
    if len(cores) > SMALL_CPU_CORES or not contiguous:
        return Choice(None, f"vLLM's NUMA-aware default on {len(cores)} cores")
    binding = f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    return Choice(binding, f"every core of {len(cores)}: vLLM's default leaves one to its front end")


def choose_eager(setting: bool | str, accelerator_kind: str, cpu: CpuInfo, compile_cache_present: bool) -> Choice:
    """True: eager (fast start); False: compiled (faster generation). `auto` compiles wherever compiled kernels
    can win, and says what the start will cost."""
    if setting != "auto":
        return Choice(bool(setting), "as configured")
    if accelerator_kind == "cuda":
        return Choice(False, "GPU: torch.compile and CUDA graphs up to max_num_seqs, vLLM's default")
    if not any(flag in cpu.flags for flag in VECTOR_FLAGS):
        return Choice(True, "the CPU has no AVX2/AVX-512/NEON for compiled kernels to use")
    if compile_cache_present:
        return Choice(False, "compile cache found: this start loads it")
    if cpu.cores < 2:
        return Choice(True, "one core and no compile cache: compiling would hold the only core for minutes")
    return Choice(False, "first start compiles (minutes on a small CPU), later starts load the cache; compiled kernels "
                         "generate faster than eager ones (benchmarks/README.md, server_bench)")


def choose_sleep_mode(setting: bool, platform: str, platform_has_it: bool) -> Choice | None:
    """vLLM's sleep mode, asked for by a colocated trainer (None: not asked). vLLM refuses to start with it where
    the platform has none, so there the engine starts without it, and the reason says so."""
    if not setting:
        return None
    if not platform_has_it:
        return Choice(False, f"vLLM has no sleep mode on {platform} (CUDA, ROCm and XPU only)")
    return Choice(True, "a colocated trainer frees the engine's weights and KV cache while it updates")


def compile_cache_dir(cache_dir: Path, factors: dict) -> Path:
    """The VLLM_CACHE_ROOT of one model and configuration: a directory per distinct set of factors (model, its
    config, dtype, shapes, vLLM and torch versions, CPU), so that whether it holds a compiled graph says whether
    this start will compile. vLLM keys its artifacts inside it by its own hash, and checks them on load."""
    key = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir / "vllm-compile" / key


# Where a compiled start leaves what the next one loads, under one model's VLLM_CACHE_ROOT, and the files that
# appear only once a compile finished (others appear as soon as it begins):
# - on CPU, inductor's cache (TORCHINDUCTOR_CACHE_DIR): an entry per compiled graph under fxgraph/;
# - on GPU, vLLM's AOT-compiled model (torch_compile_cache/torch_aot_compile/<hash>/rank_<r>_<d>/model), or the
#   index of compiled graphs of its older path (torch_compile_cache/<hash>/rank_<r>_<d>/<prefix>/vllm_compile_cache.py).
INDUCTOR_CACHE = "inductor"
FINISHED_COMPILE_FILES = ("model", "vllm_compile_cache.py")


def compile_cache_present(directory: Path) -> bool:
    """Whether a compiled start finished writing its cache under this VLLM_CACHE_ROOT."""
    graphs = directory / INDUCTOR_CACHE / "fxgraph"
    if graphs.is_dir() and any(path.is_file() for path in graphs.rglob("*")):
        return True
    compiled = directory / "torch_compile_cache"
    return compiled.is_dir() and any(path.name in FINISHED_COMPILE_FILES and path.is_file() for path in compiled.rglob("*"))


@dataclass(frozen=True)
class EngineDefaults:
    dtype: Choice
    eager: Choice
    threads_bind: Choice | None  # None on GPUs
    kv_cache: str  # e.g. "2 GiB" or "85% of GPU memory"
    compile_cache: Path | None  # None when eager
    sleep_mode: Choice | None = None  # None: not asked for


def engine_environment(defaults: EngineDefaults, accelerator_kind: str, cpu_kv_cache_gib: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables vLLM's engine processes read at start for these defaults; explicit values in `environ`
    win for the KV-cache size, the host address and AOT compilation."""
    variables = {}
    if accelerator_kind == "cpu":
        variables["VLLM_CPU_KVCACHE_SPACE"] = environ.get("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
        if defaults.threads_bind is not None and defaults.threads_bind.value is not None:
            variables["VLLM_CPU_OMP_THREADS_BIND"] = defaults.threads_bind.value
        # On hosts without a routable interface vLLM cannot pick an address for its internal sockets.
        variables["VLLM_HOST_IP"] = environ.get("VLLM_HOST_IP", "127.0.0.1")
    if defaults.compile_cache is not None:
        variables["VLLM_CACHE_ROOT"] = str(defaults.compile_cache)
        if accelerator_kind == "cpu":
            # vLLM 0.32's CPU backend saves an AOT-compiled model it then fails to load ("'function' object has no
            # attribute 'finalize_loading'"), so every start would compile again; without AOT, inductor's own
            # cache serves the second start.
            variables["VLLM_USE_AOT_COMPILE"] = environ.get("VLLM_USE_AOT_COMPILE", "0")
            variables["TORCHINDUCTOR_CACHE_DIR"] = str(defaults.compile_cache / INDUCTOR_CACHE)
    return variables


def describe(defaults: EngineDefaults) -> str:
    """The one log line with every choice and its reason."""
    parts = [f"{defaults.dtype.value} ({defaults.dtype.why})"]
    mode = "eager" if defaults.eager.value else "compiled"
    cache = f", cache {defaults.compile_cache}" if defaults.compile_cache is not None else ""
    parts.append(f"{mode} ({defaults.eager.why}{cache})")
    if defaults.threads_bind is not None:
        parts.append(f"threads {defaults.threads_bind.value or 'vLLM default'} ({defaults.threads_bind.why})")
    parts.append(f"kv cache {defaults.kv_cache}")
    if defaults.sleep_mode is not None:
        parts.append(f"sleep mode {'on' if defaults.sleep_mode.value else 'off'} ({defaults.sleep_mode.why})")
    return "engine defaults: " + ", ".join(parts)
