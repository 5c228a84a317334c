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
    engine_environment,
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


@pytest.mark.parametrize(
    "finished",
    [
        "inductor/fxgraph/b7/fb7kipt/gg4gp5r",  # inductor's entry for a compiled graph, as written here on CPU
        "torch_compile_cache/torch_aot_compile/6b866d/rank_0_0/model",  # vLLM 0.32's AOT path, as written here
        "torch_compile_cache/0a1b2c/rank_0_0/backbone/vllm_compile_cache.py",
    ],
)
def test_compile_cache_counts_only_a_finished_compile(tmp_path, finished):
    assert not compile_cache_present(tmp_path / "missing")
    begun = tmp_path / "torch_compile_cache/torch_aot_compile/6b866d"
    (begun / "inductor_cache/xi").mkdir(parents=True)  # written as compiling begins
    (begun / "inductor_cache/xi/kernel.cpp").write_text("")
    (tmp_path / "inductor/locks").mkdir(parents=True)
    (tmp_path / "inductor/locks/x.lock").write_text("")
    assert not compile_cache_present(tmp_path)
    (tmp_path / finished).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / finished).write_bytes(b"")
    assert compile_cache_present(tmp_path)


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


def _defaults(accelerator: str, compiled: bool) -> EngineDefaults:
    return EngineDefaults(
        dtype=Choice("float32", "facts"), eager=Choice(not compiled, "facts"),
        threads_bind=Choice("0-1", "facts") if accelerator == "cpu" else None, kv_cache="2 GiB",
        compile_cache=Path("/cache/vllm-compile/abc") if compiled else None,
    )


def test_engine_environment_of_a_compiled_cpu_engine():
    variables = engine_environment(_defaults("cpu", compiled=True), "cpu", 2, {})
    assert variables == {
        "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CACHE_ROOT": "/cache/vllm-compile/abc", "VLLM_USE_AOT_COMPILE": "0", "TORCHINDUCTOR_CACHE_DIR": "/cache/vllm-compile/abc/inductor",
    }


def test_engine_environment_keeps_explicit_values_and_sets_no_cache_when_eager():
    given = {"VLLM_CPU_KVCACHE_SPACE": "8", "VLLM_HOST_IP": "10.0.0.2"}
    variables = engine_environment(_defaults("cpu", compiled=False), "cpu", 2, given)
    assert variables == {"VLLM_CPU_KVCACHE_SPACE": "8", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_HOST_IP": "10.0.0.2"}


def test_engine_environment_on_a_gpu_keeps_vllms_aot_cache():
    assert engine_environment(_defaults("cuda", compiled=True), "cuda", 2, {}) == {"VLLM_CACHE_ROOT": "/cache/vllm-compile/abc"}
