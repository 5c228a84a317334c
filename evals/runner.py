"""The runner: generate, grade and store every (doc, sample) of a suite, with bounded concurrency, resumable.

Each sample is written (request, response, trajectory, grade, token and tool counts) in its own transaction
as soon as it is graded. The table's unique key (run, benchmark, doc, sample index) and the skip list read
at start make a resumed run (`rstar eval run --resume RUN_ID`, after a crash or `kill -9`) generate only the
samples that are missing, and never count one twice. A run's configuration is stored with it, so a resume
repeats exactly what was asked; samples are seeded per (run seed, benchmark, doc, index), so a regenerated
sample is the one the first attempt would have drawn.

Pure planning (`plan`, `select_docs`, `pending`, `summarize`) is separate from the edges: the database
(`RunStore`), the model (`ChatClient`) and the progress display.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from statistics import fmean
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from rstar.evals.answers import PAPER_EXTRACTION, answer_view
from rstar.evals.client import ChatClient, FatalRequestError, GenerationParams, Sample, generate
from rstar.evals.registry import MODEL_PENALTIES, SAMPLING_DEFAULTS, Benchmark, Doc, Grade, get_benchmark
from rstar.server.db import EvalRun, EvalSample
from rstar.server.trajectory import cut_off

log = logging.getLogger("rstar.evals")

# Sampling knobs a run may override; anything not given comes from the benchmark's paper defaults.
SAMPLING_KEYS = ("temperature", "top_p", "samples", "max_turns", "max_tokens", "template", "frequency_penalty", "repetition_penalty")


# ------------------------------------------------------------------------------------------------ plan


def plan(suite: Iterable[str], overrides: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Sampling per benchmark (registry name -> settings): paper defaults, then the given overrides.

    A flag given on the command line applies to every benchmark in the suite, as in lm-eval.
    """
    planned = {}
    for name in suite:
        bench = get_benchmark(name)
        settings = {**SAMPLING_DEFAULTS, **MODEL_PENALTIES, **asdict(bench.sampling)}
        settings.update({key: value for key, value in overrides.items() if key in SAMPLING_KEYS and value is not None})
        planned[bench.name] = {key: settings[key] for key in SAMPLING_KEYS}
        if bench.sampling.reasoning_max_tokens and overrides.get("max_tokens") is None:
            # Chosen once the run knows whether its template opens a reasoning block (`open_reasoning_budgets`).
            planned[bench.name]["reasoning_max_tokens"] = bench.sampling.reasoning_max_tokens
    return planned


def open_reasoning_budgets(benchmarks: dict[str, dict[str, Any]], opens_reasoning: dict[str, bool]) -> dict[str, dict[str, Any]]:
    """The planned sampling with each benchmark's reasoning budget in force where its template opens every
    answer in a reasoning block; `reasoning_max_tokens` stays in the stored config to show what was chosen."""
    return {
        name: {**sampling, "max_tokens": sampling["reasoning_max_tokens"]}
        if sampling.get("reasoning_max_tokens") and opens_reasoning.get(name)
        else sampling
        for name, sampling in benchmarks.items()
    }


def select_docs(docs: list[Doc], limit: int | None) -> list[Doc]:
    """The first `limit` docs, or of each category where docs have one (BFCL: its score is a formula over 17
    categories, so a limited run that took only the first category's docs would exercise one of them)."""
    if limit is None:
        return docs
    taken: dict[Any, int] = {}
    selected = []
    for doc in docs:
        category = doc.get("category")
        if taken.get(category, 0) < limit:
            taken[category] = taken.get(category, 0) + 1
            selected.append(doc)
    return selected


def sample_seed(seed: int, benchmark: str, doc_id: str, sample_index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{benchmark}:{doc_id}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def pending(docs: list[Doc], samples: int, done: set[tuple[str, int]]) -> list[tuple[Doc, int]]:
    return [(doc, index) for doc in docs for index in range(samples) if (doc["id"], index) not in done]


# ----------------------------------------------------------------------------------------------- store


@dataclass(frozen=True)
class SampleStats:
    benchmark: str
    score: float
    prompt_tokens: int
    completion_tokens: int
    num_turns: int
    num_tool_calls: int


class RunStore:
    """The runner's queries on the runs and samples tables (`rstar.server.db`, whose /v1/evals routes read the
    same rows). Synchronous: the runner calls it from one writer thread. `sessions`: the process's one
    session factory for its database (`open_database`)."""

    def __init__(self, sessions: sessionmaker):
        self.sessions = sessions

    def create(self, run_id: str | None, model: str, endpoint: str, suite: list[str], config: dict) -> EvalRun:
        with self.sessions.begin() as session:
            run = EvalRun(model=model, endpoint=endpoint, suite=suite, config=config, summary={}, run_dir="")
            if run_id:
                run.id = run_id
            session.add(run)
        return run

    def get(self, run_id: str) -> EvalRun | None:
        with self.sessions() as session:
            return session.get(EvalRun, run_id)

    def runs(self) -> list[tuple[EvalRun, int]]:
        """Every run, newest first, with its stored sample count."""
        with self.sessions() as session:
            counts = select(EvalSample.run_id, func.count().label("n")).group_by(EvalSample.run_id).subquery()
            rows = session.execute(
                select(EvalRun, func.coalesce(counts.c.n, 0)).outerjoin(counts, counts.c.run_id == EvalRun.id).order_by(EvalRun.created_at.desc())
            ).all()
            return [(run, n) for run, n in rows]

    def done(self, run_id: str, benchmark: str) -> dict[tuple[str, int], float]:
        """(doc id, sample index) -> score of the samples already stored."""
        with self.sessions() as session:
            rows = session.execute(
                select(EvalSample.doc_id, EvalSample.sample_index, EvalSample.score).where(EvalSample.run_id == run_id, EvalSample.benchmark == benchmark)
            ).all()
        return {(doc_id, index): score for doc_id, index, score in rows}

    def add(self, run_id: str, benchmark: str, grade: Grade, sample: Sample) -> bool:
        """Store one graded sample; False when it is already stored (another process resumed the same run)."""
        row = EvalSample(
            run_id=run_id,
            benchmark=benchmark,
            doc_id=grade.doc_id,
            sample_index=grade.sample_index,
            score=grade.score,
            grade=grade.details,
            request=sample.request,
            response=sample.response,
            trajectory=sample.trajectory,
            prompt_tokens=sample.prompt_tokens,
            completion_tokens=sample.completion_tokens,
            num_turns=sample.num_turns,
            num_tool_calls=sample.num_tool_calls,
        )
        try:
            with self.sessions.begin() as session:
                session.add(row)
        except IntegrityError:
            return False
        return True

    def grades(self, run_id: str, benchmark: str) -> list[Grade]:
        with self.sessions() as session:
            rows = session.execute(
                select(EvalSample.doc_id, EvalSample.sample_index, EvalSample.score, EvalSample.grade)
                .where(EvalSample.run_id == run_id, EvalSample.benchmark == benchmark)
                .order_by(EvalSample.id)
            ).all()
        return [Grade(doc_id, index, score, details) for doc_id, index, score, details in rows]

    def stats(self, run_id: str) -> list[SampleStats]:
        with self.sessions() as session:
            rows = session.execute(
                select(
                    EvalSample.benchmark, EvalSample.score, EvalSample.prompt_tokens, EvalSample.completion_tokens, EvalSample.num_turns, EvalSample.num_tool_calls
                ).where(EvalSample.run_id == run_id)
            ).all()
        return [SampleStats(*row) for row in rows]

    def update(self, run_id: str, **fields: Any) -> None:
        with self.sessions.begin() as session:
            run = session.get(EvalRun, run_id)
            for key, value in fields.items():
                setattr(run, key, value)


# -------------------------------------------------------------------------------------------- summary


def summarize(bench: Benchmark, grades: list[Grade], stats: list[SampleStats], expected: int) -> dict[str, Any]:
    """One benchmark's scores (its own aggregate, the primary metric with its standard error) and the
    per-sample averages behind them."""
    summary: dict[str, Any] = {"primary_metric": bench.primary_metric, "samples": len(grades), "expected_samples": expected}
    summary["complete"] = len(grades) == expected
    # Samples the server refused (prompt over its context window): stored and scored 0, counted here.
    summary["refused"] = sum(1 for g in grades if g.details.get("generation_errors"))
    # Share of samples cut off by the token budget or the turn limit rather than ending their answer.
    summary["truncation_rate"] = fmean(1.0 if g.details.get("truncated") else 0.0 for g in grades) if grades else None
    if grades:
        metrics = bench.aggregate(grades)
        summary.update(
            score=metrics[bench.primary_metric],
            stderr=metrics.get(f"{bench.primary_metric}_stderr"),
            docs=len({g.doc_id for g in grades}),
            metrics=metrics,
        )
    if stats:
        for key in ("prompt_tokens", "completion_tokens", "num_turns", "num_tool_calls"):
            summary[f"mean_{key}"] = fmean(getattr(s, key) for s in stats)
    return summary


# ------------------------------------------------------------------------------------------------ run


class Progress(Protocol):
    def add_benchmark(self, benchmark: str, total: int, completed: int, score_sum: float) -> None: ...

    def advance(self, benchmark: str, score: float) -> None: ...


class _NoProgress:
    def add_benchmark(self, benchmark: str, total: int, completed: int, score_sum: float) -> None:
        pass

    def advance(self, benchmark: str, score: float) -> None:
        pass


@dataclass
class Outcome:
    run_id: str
    status: str
    summary: dict[str, Any]
    generated: int  # samples generated and stored by this invocation
    skipped: int  # samples found already stored (a resume)
    failed: int  # samples whose generation failed (not stored; a resume retries them)


@dataclass(frozen=True)
class _Work:
    bench: Benchmark
    doc: Doc
    index: int
    params: GenerationParams


async def execute(
    store: RunStore,
    run: EvalRun,
    client: ChatClient,
    concurrency: int,
    progress: Progress | None = None,
    docs: dict[str, list[Doc]] | None = None,
) -> Outcome:
    """Generate, grade and store every missing sample of `run`, then summarize it from the stored samples.

    docs: the loaded docs per benchmark (tests and benchmarks pass them); by default each benchmark loads
    from the run's data dir. Grading runs on the calling thread (math-verify's timeouts need the main
    thread); database writes go through one writer thread so the event loop never waits on the disk.
    """
    progress = progress or _NoProgress()
    config = run.config
    data_dir = Path(config["data_dir"]) if config.get("data_dir") else None
    queue: asyncio.Queue[_Work] = asyncio.Queue()
    expected: dict[str, int] = {}
    skipped = 0
    for name, stored in config["benchmarks"].items():
        sampling = {**SAMPLING_DEFAULTS, **stored}
        bench = get_benchmark(name)
        selected = select_docs(docs[name] if docs is not None else bench.load(data_dir), config.get("limit"))
        done = store.done(run.id, name)  # before any worker starts: nothing else waits on the loop yet
        todo = pending(selected, sampling["samples"], set(done))
        expected[name] = len(selected) * sampling["samples"]
        skipped += len(done)
        progress.add_benchmark(name, expected[name], len(done), sum(done.values()))
        for doc, index in todo:
            params = GenerationParams(
                model=run.model,
                template=sampling["template"],
                temperature=sampling["temperature"],
                top_p=sampling["top_p"],
                frequency_penalty=sampling["frequency_penalty"],
                repetition_penalty=sampling["repetition_penalty"],
                max_tokens=sampling["max_tokens"],
                max_turns=sampling["max_turns"],
                seed=sample_seed(config.get("seed", 0), name, doc["id"], index),
                tool_timeout=config.get("tool_timeout"),
            )
            queue.put_nowait(_Work(bench, doc, index, params))

    extraction = config.get("answer_extraction", PAPER_EXTRACTION)  # runs stored before the setting: the paper's
    counts = {"generated": 0, "failed": 0}
    loop = asyncio.get_running_loop()
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eval-writer")

    async def worker() -> None:
        while not queue.empty():
            work = queue.get_nowait()
            env = work.bench.environment(work.doc) if work.bench.environment else None
            try:
                sample = await generate(client, work.bench.build_prompt(work.doc, work.index), work.params, env)
                if work.bench.grade_view is not None:
                    grade = work.bench.grade_view(work.doc, answer_view(sample.trajectory), work.index, extraction)
                else:
                    grade = work.bench.grade(work.doc, sample.response, work.index)
            except FatalRequestError:
                raise
            except Exception as exc:  # one sample's failure must not lose the others; a resume retries it
                counts["failed"] += 1
                # The doc id only: question text (GPQA's) never goes to logs.
                log.warning("%s doc %s sample %d failed: %s: %s", work.bench.name, work.doc["id"], work.index, type(exc).__name__, exc)
                continue
            if sample.errors:
                grade.details["generation_errors"] = sample.errors
            grade.details["truncated"] = not sample.errors and cut_off(sample.trajectory.get("stop_reason"))  # a refusal is counted apart
            if await loop.run_in_executor(writer, store.add, run.id, work.bench.name, grade, sample):
                counts["generated"] += 1
            progress.advance(work.bench.name, grade.score)

    status = "interrupted"
    workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))]
    try:
        await asyncio.gather(*workers)
        status = "finished" if counts["failed"] == 0 else "failed"
    except FatalRequestError:
        status = "failed"
        raise
    finally:
        # A fatal error or a cancellation stops every worker: no request goes out after it.
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        try:
            summary = await loop.run_in_executor(writer, _summaries, store, run.id, expected)
            summary_fields = {"summary": summary, "status": status}
            if status != "interrupted":
                summary_fields["finished_at"] = datetime.now(timezone.utc)
            await loop.run_in_executor(writer, lambda: store.update(run.id, **summary_fields))
        finally:
            writer.shutdown(wait=True)
    return Outcome(run.id, status, summary, counts["generated"], skipped, counts["failed"])


def _summaries(store: RunStore, run_id: str, expected: dict[str, int]) -> dict[str, Any]:
    stats = store.stats(run_id)
    return {
        name: summarize(get_benchmark(name), store.grades(run_id, name), [s for s in stats if s.benchmark == name], count)
        for name, count in expected.items()
    }
