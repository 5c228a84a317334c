"""Benchmark harness: registry, loaders and graders; `client` (how a sample is generated), `runner` (generate,
grade and store every sample, resumable), `report` (JSON, Markdown, plots) and `cli` (`rstar eval`) build on them.

    from rstar.evals import get_benchmark
    bench = get_benchmark("aime24")
    docs = bench.load(data_dir)          # data_dir=None: the benchmark's default source
"""

from rstar.evals import bfcl, gpqa, gsm8k, ifeval, math_tasks  # noqa: F401  (each registers its benchmarks)
from rstar.evals.data import DataUnavailable
from rstar.evals.registry import (
    NATIVE_TEMPLATE,
    REGISTRY,
    RSTAR_TEMPLATE,
    Benchmark,
    Grade,
    Prompt,
    Sampling,
    get_benchmark,
)

__all__ = [
    "NATIVE_TEMPLATE",
    "REGISTRY",
    "RSTAR_TEMPLATE",
    "Benchmark",
    "DataUnavailable",
    "Grade",
    "Prompt",
    "Sampling",
    "get_benchmark",
]
