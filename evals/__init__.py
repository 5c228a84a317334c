"""Benchmark harness: registry, loaders, graders (the runner and reports build on these).

    from rstar.evals import get_benchmark
    bench = get_benchmark("aime24")
    docs = bench.load(data_dir)          # data_dir=None: the benchmark's default source
"""

from rstar.evals import bfcl, gpqa, ifeval, math_tasks  # noqa: F401  (each registers its benchmarks)
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
