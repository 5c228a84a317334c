"""The benchmark registry: one small declarative entry per benchmark, in the spirit of lm-eval's task configs.

A benchmark is four pure functions plus its default sampling:

    docs   = bench.load(data_dir)                      # data_dir=None: the Hugging Face id (or packaged data)
    prompt = bench.build_prompt(doc, sample_index)     # messages (+ tools) for one sample of one doc
    grade  = bench.grade(doc, response, sample_index)  # Grade(score in [0, 1], details)
    scores = bench.aggregate(grades)                   # the benchmark's reported metrics
    missing = bench.grader_problems()                  # what this machine lacks to grade it ([] = ready)

`response` is the final assistant text for text benchmarks, and the model's tool calls for BFCL
(see `rstar.evals.bfcl`). The runner owns generation; nothing here talks to a model.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

Doc = dict[str, Any]

# Template choices the runner passes on to the server:
RSTAR_TEMPLATE = "rstar"  # rStar2-Agent's system prompt + answer instruction, python tool offered
NATIVE_TEMPLATE = "native"  # the benchmark's own prompt as given, no added instruction, no python tool


# Knobs the paper gives no value for, the same for every benchmark: vLLM's and OpenAI's defaults (no penalty).
# A run stored before a knob existed sampled with its default.
SAMPLING_DEFAULTS = {"top_p": 1.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
# A new run leaves each penalty no flag sets to the served model (None: not sent), as a client of its server
# would: off for every model but one whose recommended decoding has one (`model_sampling_defaults`). The run
# stores which penalties that was (`model_sampling_defaults` in its config).
MODEL_PENALTIES = {"frequency_penalty": None, "repetition_penalty": None}


@dataclass(frozen=True)
class Sampling:
    """Generation defaults for a benchmark (rStar2-Agent paper §5.1 unless noted at the entry)."""

    temperature: float
    samples: int  # k: samples per doc; the headline metric is the mean over them (avg@k)
    max_turns: int  # assistant turns per doc (tool round trips + final answer)
    max_tokens: int  # whole-response budget, tool output included
    template: str  # RSTAR_TEMPLATE or NATIVE_TEMPLATE
    # The budget instead of `max_tokens` when the model's template opens every answer inside a reasoning block
    # (rStar's `<reason>`): a cap sized for a plain answer would cut the reasoning. None: `max_tokens` either way.
    reasoning_max_tokens: int | None = None


@dataclass(frozen=True)
class Prompt:
    """What the runner sends for one sample.

    `messages` opens the conversation. Multi-turn benchmarks (BFCL multi_turn_*) add `followups`: the user
    messages of each later turn, sent once the model has finished the previous one, and `tools_added`: tools
    that become available at a given turn index (BFCL miss_func).
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    followups: list[list[dict[str, Any]]] = field(default_factory=list)
    tools_added: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Grade:
    doc_id: str
    sample_index: int
    score: float  # 1.0 correct, 0.0 wrong; the headline metric averages this
    details: dict[str, Any] = field(default_factory=dict)  # grader evidence (extracted answer, permutation, ...)


@dataclass(frozen=True)
class Benchmark:
    name: str
    source: str  # default data source: the Hugging Face dataset id the anchors use, or the package that ships it
    load: Callable[[Path | None], list[Doc]]
    build_prompt: Callable[[Doc, int], Prompt]
    grade: Callable[[Doc, Any, int], Grade]
    aggregate: Callable[[list[Grade]], dict[str, Any]]
    sampling: Sampling
    primary_metric: str  # the key of `aggregate`'s result that the paper reports
    # For benchmarks whose tool calls the harness executes while generating (BFCL multi-turn): a fresh
    # environment for one sample of a doc, or None when that doc needs none.
    environment: Callable[[Doc], Any] | None = None
    # For benchmarks whose answer extraction is a run setting (math): grade the whole answer view
    # (`rstar.evals.answers.AnswerView`) under the run's extraction name instead of `grade`.
    grade_view: Callable[[Doc, Any, int, str], Grade] | None = None
    # What grading needs that this install lacks, one line each naming the fix; checked before a run starts,
    # so a missing package stops it at once instead of failing every sample.
    grader_problems: Callable[[], list[str]] = lambda: []


# How to get back what install.sh and the core dependencies install.
REINSTALL = "run `bash install.sh` (or `pip install -e .` in the environment rstar runs from)"


def missing_packages(benchmark: str, modules: dict[str, str], fix: str = REINSTALL) -> list[str]:
    """A problem line for the packages (import name -> distribution name) that cannot be imported here.

    Looks modules up without importing them, so `rstar eval suites` stays fast."""
    missing = [dist for module, dist in modules.items() if importlib.util.find_spec(module) is None]
    return [f"{benchmark} grading needs {', '.join(missing)}, not installed: {fix}"] if missing else []


REGISTRY: dict[str, Benchmark] = {}


def register(benchmark: Benchmark) -> Benchmark:
    if benchmark.name in REGISTRY:
        raise ValueError(f"benchmark {benchmark.name!r} is registered twice")
    REGISTRY[benchmark.name] = benchmark
    return benchmark


# Short names for registry entries, as the paper's tables write them.
ALIASES = {"hmmt25": "hmmt_feb_2025", "math-500": "math500", "math_500": "math500"}


def get_benchmark(name: str) -> Benchmark:
    try:
        return REGISTRY[ALIASES.get(name, name)]
    except KeyError:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
