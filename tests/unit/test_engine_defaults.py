"""The engine's defaults chosen from hardware facts, and the one line that reports them (no engine)."""

from pathlib import Path

import pytest

from rstar.hardware import CpuInfo
from rstar.server.engine_defaults import (
    Choice,
    EngineDefaults,
    choose_dtype,
    choose_eager,
    choose_threads_bind,
    compile_cache_dir,
    compile_cache_present,
    describe,
)

XEON = CpuInfo(model="Intel Xeon", cores=2, flags=("avx2", "avx512f", "avx512_vnni"))  # no AVX512_BF16: the machine
ZEN4 = CpuInfo(model="AMD EPYC", cores=2, flags=("avx2", "avx512f", "avx512_bf16"))
OLD_X86 = CpuInfo(model="old", cores=4, flags=())
ONE_CORE = CpuInfo(model="Intel Xeon", cores=1, flags=("avx2", "avx512f"))


@pytest.mark.parametrize(
    ("setting", "accelerator", "cpu", "dtype", "warns"),
    [
        ("auto", "cpu", XEON, "float32", False),
        ("auto", "cpu", ZEN4, "bfloat16", False),
        ("auto", "cuda", XEON, "bfloat16", False),
        ("bfloat16", "cpu", XEON, "bfloat16", True),  # honoured, with the cost named
        ("bfloat16", "cpu", ZEN4, "bfloat16", False),
        ("float32", "cpu", ZEN4, "float32", False),
    ],
)
def test_dtype_follows_native_bf16(setting, accelerator, cpu, dtype, warns):
    choice = choose_dtype(setting, accelerator, cpu)
    assert choice.value == dtype
    assert (choice.warning is not None) == warns
    if warns:
        assert "float32" in choice.warning and cpu.model in choice.warning


@pytest.mark.parametrize(
    ("setting", "accelerator", "cpu", "cached", "eager", "why_has"),
    [
        ("auto", "cpu", XEON, False, False, "first start compiles"),
        ("auto", "cpu", XEON, True, False, "compile cache found"),
        ("auto", "cuda", OLD_X86, False, False, "GPU"),
        ("auto", "cpu", OLD_X86, True, True, "no AVX2"),
        ("auto", "cpu", ONE_CORE, False, True, "one core"),
        ("auto", "cpu", ONE_CORE, True, False, "compile cache found"),
        (True, "cpu", XEON, True, True, "as configured"),
        (False, "cpu", OLD_X86, False, False, "as configured"),
    ],
)
def test_eager_or_compiled(setting, accelerator, cpu, cached, eager, why_has):
    choice = choose_eager(setting, accelerator, cpu, cached)
    assert choice.value is eager
    assert why_has in choice.why


@pytest.mark.parametrize(
    ("setting", "cores", "environment", "binding"),
    [
        ("auto", [0, 1], None, "0-1"),
        ("auto", [3], None, "3"),
        ("auto", list(range(8)), None, None),  # vLLM's NUMA-aware default
        ("auto", [0, 2], None, None),  # not contiguous: no range says it
        ("0", [0, 1], None, "0"),
        ("auto", [0, 1], "1", "1"),  # the environment wins
    ],
)
def test_threads_bind(setting, cores, environment, binding):
    assert choose_threads_bind(setting, cores, environment).value == binding


def test_compile_cache_dir_is_keyed_by_every_factor(tmp_path):
    factors = {"model": "/m", "dtype": "float32", "max_num_seqs": 64}
    same = compile_cache_dir(tmp_path, dict(reversed(factors.items())))
    assert compile_cache_dir(tmp_path, factors) == same
    assert same.is_relative_to(tmp_path)
    for key, other in (("dtype", "bfloat16"), ("max_num_seqs", 16), ("model", "/n")):
        assert compile_cache_dir(tmp_path, factors | {key: other}) != same


def test_compile_cache_counts_only_a_finished_compile(tmp_path):
    directory = tmp_path / "key"
    assert not compile_cache_present(directory)
    started = directory / "rank_0_0" / "backbone"
    started.mkdir(parents=True)
    (started / "cache_key_factors.json").write_text("{}")  # written as compiling begins
    assert not compile_cache_present(directory)
    (started / "vllm_compile_cache.py").write_text("{}")
    assert compile_cache_present(directory)


def test_describe_names_every_choice_and_reason():
    defaults = EngineDefaults(
        dtype=choose_dtype("auto", "cpu", XEON),
        eager=choose_eager("auto", "cpu", XEON, False),
        threads_bind=choose_threads_bind("auto", [0, 1], None),
        kv_cache="2 GiB, 43680 tokens",
        compile_cache=Path("/cache/vllm-compile/abc"),
    )
    line = describe(defaults)
    assert line.startswith("engine defaults: float32 (the CPU has no native bf16")
    assert "compiled (first start compiles" in line and "cache /cache/vllm-compile/abc" in line
    assert "threads 0-1 (every core of 2" in line
    assert line.endswith("kv cache 2 GiB, 43680 tokens")
    assert "\n" not in line


def test_describe_on_a_gpu_has_no_thread_binding():
    defaults = EngineDefaults(
        dtype=Choice("bfloat16", "a GPU"), eager=Choice(True, "as configured"), threads_bind=None, kv_cache="85% of GPU memory", compile_cache=None
    )
    assert describe(defaults) == "engine defaults: bfloat16 (a GPU), eager (as configured), kv cache 85% of GPU memory"
