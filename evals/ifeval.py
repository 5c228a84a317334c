"""IFEval: 541 prompts with 834 verifiable instructions, scored by the official rule-based checkers.

The checkers are lm-eval's (Google's code as lm-eval ships it), called through lm-eval's own per-response
function, so our scores equal lm-eval's on the same responses by construction; only the aggregation is ours.
Three run-time hazards are closed here: NLTK's punkt_tab must already be installed (install.sh puts it in the
venv; lm-eval would otherwise try to download it), langdetect's seed is fixed so language checks repeat, and
the checkers' own random draws are seeded per prompt.
"""

from __future__ import annotations

import random
import types
from functools import cache, lru_cache
from pathlib import Path
from statistics import fmean

from rstar.evals.data import hf_rows, local_file, read_jsonl
from rstar.evals.metrics import mean_stderr
from rstar.evals.registry import NATIVE_TEMPLATE, Benchmark, Doc, Grade, Prompt, Sampling, missing_packages, register

HF_ID = "google/IFEval"
LANGDETECT_SEED = 0


class CheckersUnavailable(RuntimeError):
    pass


def load(data_dir: Path | None) -> list[Doc]:
    rows = hf_rows("ifeval", HF_ID, "train") if data_dir is None else read_jsonl(local_file(data_dir, "ifeval", "input_data.jsonl"))
    return [
        {
            "id": str(row["key"]),
            "key": row["key"],
            "prompt": row["prompt"],
            "instruction_id_list": row["instruction_id_list"],
            "kwargs": row["kwargs"],
        }
        for row in rows
    ]


def build_prompt(doc: Doc, sample_index: int) -> Prompt:
    return Prompt(messages=[{"role": "user", "content": doc["prompt"]}])


# The checkers' imports: lm-eval's ifeval extra.
CHECKER_PACKAGES = {"lm_eval": "lm-eval", "langdetect": "langdetect", "nltk": "nltk", "immutabledict": "immutabledict"}
PUNKT_MISSING = (
    "NLTK's punkt_tab tokenizer is not installed; IFEval's sentence and word checks need it. "
    "Run `bash install.sh` (it unpacks punkt_tab into the venv) or set NLTK_DATA to a folder holding "
    "tokenizers/punkt_tab/english/."
)


def _punkt_installed() -> bool:
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        return False
    return True


def grader_problems() -> list[str]:
    problems = missing_packages("ifeval", CHECKER_PACKAGES)
    if not problems and not _punkt_installed():
        problems.append(f"ifeval grading: {PUNKT_MISSING}")
    return problems


@cache
def _lm_eval_ifeval():
    import langdetect

    if not _punkt_installed():
        raise CheckersUnavailable(PUNKT_MISSING)
    langdetect.DetectorFactory.seed = LANGDETECT_SEED
    from lm_eval.tasks.ifeval import instructions, utils

    # Seeded, detection is a pure function of the text, so it can be memoized: loose scoring runs each checker
    # on 8 variants of a response, often identical, and detection is most of IFEval's grading time.
    instructions.langdetect = types.SimpleNamespace(
        detect=lru_cache(maxsize=4096)(langdetect.detect), LangDetectException=langdetect.LangDetectException
    )
    return utils


def checker_seed(doc: Doc) -> str:
    return f"ifeval:{doc['key']}"


def grade(doc: Doc, response: str, sample_index: int) -> Grade:
    checkers = _lm_eval_ifeval()
    # lm-eval's letter_frequency checker replaces a non-letter argument ('#' in prompt 1122, '!' in 1129) by
    # a letter drawn from Python's global `random`, so unseeded it grades the same response differently from
    # run to run. Seed it per doc, and give the caller's random state back afterwards.
    state = random.getstate()
    random.seed(checker_seed(doc))
    try:
        results = checkers.process_results(doc, [response])
    finally:
        random.setstate(state)
    return Grade(doc["id"], sample_index, float(results["prompt_level_strict_acc"]), results)


# lm-eval's cap for an IFEval answer (its ifeval.yaml max_gen_toks).
LM_EVAL_MAX_TOKENS = 1280
# Room for the reasoning a model writes before that answer when its template opens one (rStar's <reason>):
# 1280 + 4096 tokens plus an IFEval prompt fit the default model's 8192-token window. The truncation rate in
# every report shows whether it sufficed.
REASONING_ALLOWANCE = 4096


def aggregate(grades: list[Grade]) -> dict[str, float]:
    """Prompt level: share of prompts whose instructions all pass. Instruction level: pooled over all prompts.

    Standard errors as lm-eval computes them: over prompts, and over the pooled instructions."""
    if not grades:
        raise ValueError("no grades to aggregate")
    scores: dict[str, float] = {}
    for level in ("strict", "loose"):
        prompts = [float(g.details[f"prompt_level_{level}_acc"]) for g in grades]
        followed = [float(ok) for g in grades for ok in g.details[f"inst_level_{level}_acc"]]
        for metric, values in ((f"prompt_level_{level}_acc", prompts), (f"inst_level_{level}_acc", followed)):
            scores[metric] = fmean(values)
            scores[f"{metric}_stderr"] = mean_stderr(values)
    scores["prompts"] = len(grades)
    return scores


register(
    Benchmark(
        name="ifeval",
        source=HF_ID,
        load=load,
        build_prompt=build_prompt,
        grade=grade,
        aggregate=aggregate,
        # Paper §5.1: the benchmark's own prompt at temperature 0. The token cap is lm-eval's max_gen_toks.
        sampling=Sampling(
            temperature=0.0,
            samples=1,
            max_turns=1,
            max_tokens=LM_EVAL_MAX_TOKENS,
            template=NATIVE_TEMPLATE,
            reasoning_max_tokens=LM_EVAL_MAX_TOKENS + REASONING_ALLOWANCE,
        ),
        primary_metric="prompt_level_strict_acc",
        grader_problems=grader_problems,
    )
)
