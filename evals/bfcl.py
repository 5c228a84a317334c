"""BFCL v3 (Berkeley Function Calling Leaderboard), graded by bfcl-eval's own checkers.

The model is asked in function-calling (FC) mode the way bfcl-eval asks OpenAI-style FC models: the entry's
messages as they are, its function docs turned into OpenAI tools by bfcl-eval's converter (dots in names become
underscores, so the checker runs with an underscore-to-dot model). Responses are tool calls,
`{"name": ..., "arguments": {...} or "<json>"}` (OpenAI `tool_calls` items are accepted as well):

- single-turn categories: one list of calls (an empty list when the model answered in text);
- multi_turn_*: one list per user turn, of one list of calls per model step in that turn.

bfcl-eval (2025.8.6.2, the last release with the v3 files) is installed without its dependencies (it pins
numpy and provider SDKs that break vLLM's), so only its checker modules are imported, and only when needed.
Its AST checker imports the model table `bfcl_eval.constants.model_config`, which pulls in every provider
SDK just to look up one flag; `_ast_checker` hands it a one-entry table instead.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import sys
import types
from functools import cache
from pathlib import Path
from statistics import fmean
from typing import Any

from rstar.evals.data import DataUnavailable, read_jsonl
from rstar.evals.metrics import mean_stderr, scores_by_doc
from rstar.evals.registry import NATIVE_TEMPLATE, Benchmark, Doc, Grade, Prompt, Sampling, missing_packages, register

PACKAGE = "bfcl-eval"
FOLDER = "bfcl_v3"

NON_LIVE_AST = ("simple", "java", "javascript", "multiple", "parallel", "parallel_multiple")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
IRRELEVANCE = ("irrelevance", "live_irrelevance")
RELEVANCE = ("live_relevance",)
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
CATEGORIES = NON_LIVE_AST + LIVE_AST + IRRELEVANCE + RELEVANCE + MULTI_TURN
# Entries per category in the v3 data; BFCL weighs the live categories by these, and counts a category
# that was not run as 0 at its full size.
CATEGORY_SIZES = {
    "simple": 400, "java": 100, "javascript": 50, "multiple": 200, "parallel": 200, "parallel_multiple": 200,
    "irrelevance": 240, "live_simple": 258, "live_multiple": 1053, "live_parallel": 16,
    "live_parallel_multiple": 24, "live_irrelevance": 882, "live_relevance": 18, "multi_turn_base": 200,
    "multi_turn_miss_func": 200, "multi_turn_miss_param": 200, "multi_turn_long_context": 200,
}  # fmt: skip

# Keys of bfcl-eval's model table; the checker only reads `underscore_to_dot` from it.
CHECKER_MODEL = "gpt-4o-2024-11-20-FC"  # OpenAI-style FC: tool names had their dots replaced by underscores
_LANGUAGE = {"java": "Java", "javascript": "JavaScript"}


# ---------------------------------------------------------------------------------------------- loading


def _package_data_dir() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailable(
            f"bfcl_v3: the default data source, the {PACKAGE} package, is not installed "
            f"(`pip install --no-deps {PACKAGE}==2025.8.6.2`, done by install.sh). "
            f"Or pass a local copy: data_dir=<dir> (CLI: --data-dir <dir>) holding {FOLDER}/."
        )
    return Path(spec.submodule_search_locations[0]) / "data"


def _resolve_dir(data_dir: Path | None) -> Path:
    if data_dir is None:
        return _package_data_dir()
    for candidate in (Path(data_dir) / FOLDER, Path(data_dir)):
        if (candidate / "BFCL_v3_simple.json").is_file():
            return candidate
    raise DataUnavailable(f"bfcl_v3: no BFCL_v3_simple.json in {data_dir} or {Path(data_dir) / FOLDER}")


def grader_problems() -> list[str]:
    """bfcl-eval itself (install.sh puts it in with --no-deps), then what its checker modules import."""
    return missing_packages(
        "bfcl_v3", {"bfcl_eval": PACKAGE}, f"run `bash install.sh`, or `pip install --no-deps {PACKAGE}==2025.8.6.2` (its own pins break vLLM's)"
    ) + missing_packages(
        "bfcl_v3", {"tree_sitter": "tree-sitter", "tree_sitter_java": "tree-sitter-java", "tree_sitter_javascript": "tree-sitter-javascript", "tenacity": "tenacity"}
    )


def data_version(data_dir: Path | None) -> str:
    """Which snapshot the docs come from: a digest of the v3 files (equal for byte-identical copies)."""
    root = _resolve_dir(data_dir)
    digest = hashlib.sha256()
    files = [root / f"BFCL_v3_{c}.json" for c in CATEGORIES]
    files += [root / "possible_answer" / f"BFCL_v3_{c}.json" for c in CATEGORIES if (root / "possible_answer" / f"BFCL_v3_{c}.json").is_file()]
    files += sorted((root / "multi_turn_func_doc").glob("*.json"))
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    version = f"bfcl_v3 sha256:{digest.hexdigest()[:16]}"
    if data_dir is None:
        version += f" ({PACKAGE} {importlib.metadata.version(PACKAGE)} package data)"
    return version


def load(data_dir: Path | None, categories: tuple[str, ...] = CATEGORIES) -> list[Doc]:
    from bfcl_eval.constants.category_mapping import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    root = _resolve_dir(data_dir)
    version = data_version(data_dir)
    docs = []
    for category in categories:
        entries = list(read_jsonl(root / f"BFCL_v3_{category}.json"))
        answer_file = root / "possible_answer" / f"BFCL_v3_{category}.json"
        answers = {row["id"]: row["ground_truth"] for row in read_jsonl(answer_file)} if answer_file.is_file() else {}
        for entry in entries:
            doc = {
                "id": entry["id"],
                "category": category,
                "question": entry["question"],
                "function": entry.get("function", []),
                "ground_truth": answers.get(entry["id"]),
                "data_version": version,
            }
            if category in MULTI_TURN:
                # As bfcl-eval does: docs of every involved class, minus the ones held out until a later turn.
                functions = [
                    doc_
                    for cls in entry["involved_classes"]
                    for doc_ in read_jsonl(root / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls])
                ]
                held_out = {int(turn): names for turn, names in entry.get("missed_function", {}).items()}
                held_names = {name for names in held_out.values() for name in names}
                by_name = {f["name"]: f for f in functions}
                doc.update(
                    function=[f for f in functions if f["name"] not in held_names],
                    missed_function={turn: [by_name[n] for n in names] for turn, names in held_out.items()},
                    initial_config=entry["initial_config"],
                    involved_classes=entry["involved_classes"],
                )
            docs.append(doc)
    return docs


# --------------------------------------------------------------------------------------------- prompting


def tools_for(functions: list[dict], category: str) -> list[dict]:
    """bfcl-eval's OpenAI FC tool list for these function docs (language hint, types, dots -> underscores)."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.model_handler.model_style import ModelStyle
    from bfcl_eval.model_handler.utils import convert_to_tool, func_doc_language_specific_pre_processing

    functions = func_doc_language_specific_pre_processing(copy.deepcopy(functions), category)
    return convert_to_tool(functions, GORILLA_TO_OPENAPI, ModelStyle.OpenAI_Completions)


def build_prompt(doc: Doc, sample_index: int) -> Prompt:
    tools = tools_for(doc["function"], doc["category"])
    if doc["category"] not in MULTI_TURN:
        return Prompt(messages=doc["question"][0], tools=tools)
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

    followups = []
    for turn, messages in enumerate(doc["question"][1:], start=1):
        if turn in doc["missed_function"]:  # held-out turns have no message of their own
            messages = [{"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}]
        followups.append(messages)
    added = {turn: tools_for(fns, doc["category"]) for turn, fns in doc["missed_function"].items()}
    return Prompt(messages=doc["question"][0], tools=tools, followups=followups, tools_added=added)


# ---------------------------------------------------------------------------------------------- grading


def decode_calls(calls: list[dict]) -> list[dict[str, dict]]:
    """Our tool calls in bfcl's decoded form `[{name: {arg: value}}]`; raises if arguments are not JSON."""
    decoded = []
    for call in calls:
        call = call.get("function", call)  # an OpenAI tool_calls item wraps the call
        arguments = call["arguments"]
        decoded.append({call["name"]: json.loads(arguments) if isinstance(arguments, str) else dict(arguments)})
    return decoded


@cache
def _ast_checker():
    table = "bfcl_eval.constants.model_config"
    if table in sys.modules:  # the real table is already loaded (full bfcl-eval install): use it
        return importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker").ast_checker
    flag = types.SimpleNamespace(underscore_to_dot=True)
    sys.modules[table] = types.SimpleNamespace(MODEL_CONFIG_MAPPING={CHECKER_MODEL: flag})
    try:
        return importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker").ast_checker
    finally:
        del sys.modules[table]  # only the checker module keeps the one-entry table


_run_ids = itertools.count()


class MultiTurnEnv:
    """bfcl-eval's stateful simulators (file system, trading bot, ...) for one multi-turn entry.

    The runner executes the model's calls here during generation, as bfcl-eval's inference does. bfcl-eval
    keeps simulator instances in a module-level cache keyed by a model name and the entry id; each env
    uses its own name and `close()` drops its instances, so repeated samples start from a clean state.
    """

    def __init__(self, doc: Doc, purpose: str = "run"):
        self.doc = doc
        self._name = f"rstar{purpose}{next(_run_ids)}"

    def execute(self, calls: list[dict], evaluation: bool = False) -> list[str]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call
        from bfcl_eval.model_handler.utils import convert_to_function_call

        results, _ = execute_multi_turn_func_call(
            convert_to_function_call(decode_calls(calls)),
            self.doc["initial_config"],
            self.doc["involved_classes"],
            self._name,
            self.doc["id"],
            long_context="long_context" in self.doc["category"],
            is_evaL_run=evaluation,
        )
        return results

    def close(self) -> None:
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

        cache_ = vars(multi_turn_utils)
        for key in [k for k in cache_ if k.startswith(self._name + "_")]:
            del cache_[key]


def _grade_multi_turn(doc: Doc, turns: list[list[list[dict]]]) -> dict[str, Any]:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
    from bfcl_eval.model_handler.utils import convert_to_function_call

    if len(turns) != len(doc["ground_truth"]):
        return {"valid": False, "error_type": "multi_turn:force_terminated"}
    decoded_turns = []
    for steps in turns:
        decoded_steps = []
        for calls in steps:
            try:  # as bfcl-eval: a step whose calls do not decode (or has none) is skipped
                decoded = convert_to_function_call(decode_calls(calls))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                continue
            if decoded:
                decoded_steps.append(decoded)
        decoded_turns.append(decoded_steps)
    env = MultiTurnEnv(doc, purpose="grade")
    try:
        # The checker replays the model's and the ground-truth calls in bfcl-eval's instance cache under names
        # that start with env's, so closing the env clears both.
        result = multi_turn_checker(decoded_turns, doc["ground_truth"], doc, doc["category"], env._name)
    finally:
        env.close()
    return {"valid": result["valid"], "error_type": result.get("error_type")}


def grade(doc: Doc, response: list, sample_index: int) -> Grade:
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    category = doc["category"]
    if category in MULTI_TURN:
        outcome = _grade_multi_turn(doc, response)
    else:
        try:
            decoded = decode_calls(response)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            decoded = None  # bfcl-eval: undecodable output is "no function call"
        if category in IRRELEVANCE + RELEVANCE:
            called = decoded is not None and not is_empty_output(decoded)
            outcome = {"valid": called == (category in RELEVANCE)}
        elif decoded is None or not is_function_calling_format_output(decoded):
            outcome = {"valid": False, "error_type": "ast_decoder:decoder_failed"}
        else:
            checked = _ast_checker()(
                doc["function"], decoded, doc["ground_truth"], _LANGUAGE.get(category, "Python"), category, CHECKER_MODEL
            )
            outcome = {"valid": checked["valid"], "error_type": checked.get("error_type")}
    details = {"category": category, "data_version": doc["data_version"], **outcome}
    return Grade(doc["id"], sample_index, 1.0 if outcome["valid"] else 0.0, details)


# -------------------------------------------------------------------------------------------- aggregation


def overall_scores(accuracy: dict[str, float]) -> dict[str, float]:
    """BFCL's leaderboard formula (bfcl-eval `generate_leaderboard_csv`) over per-category accuracies.

    A category missing from `accuracy` counts as 0, as on the leaderboard.
    """
    acc = {c: accuracy.get(c, 0.0) for c in CATEGORIES}
    simple = fmean([acc["simple"], acc["java"], acc["javascript"]])
    non_live = fmean([simple, acc["multiple"], acc["parallel"], acc["parallel_multiple"], acc["irrelevance"]])
    live_categories = LIVE_AST + ("live_irrelevance", "live_relevance")
    live = sum(acc[c] * CATEGORY_SIZES[c] for c in live_categories) / sum(CATEGORY_SIZES[c] for c in live_categories)
    multi_turn = fmean(acc[c] for c in MULTI_TURN)
    return {
        "overall": fmean([live, non_live, multi_turn]),
        "non_live": non_live,
        "live": live,
        "multi_turn": multi_turn,
        "irrelevance": fmean([acc["irrelevance"], acc["live_irrelevance"]]),
        "relevance": acc["live_relevance"],
    }


def aggregate(grades: list[Grade]) -> dict[str, Any]:
    if not grades:
        raise ValueError("no grades to aggregate")
    category_of = {g.doc_id: g.details["category"] for g in grades}
    per_category: dict[str, list[float]] = {}
    for doc_id, scores in scores_by_doc(grades).items():
        per_category.setdefault(category_of[doc_id], []).append(fmean(scores))
    accuracy = {category: fmean(scores) for category, scores in per_category.items()}
    # The overall score is linear in the category accuracies, so its standard error combines theirs with the
    # formula's weights (each category's weight is the overall score it alone would give at accuracy 1).
    variance = sum(
        overall_scores({category: 1.0})["overall"] ** 2 * mean_stderr(scores) ** 2 for category, scores in per_category.items()
    )
    versions = sorted({g.details["data_version"] for g in grades})
    return {
        **overall_scores(accuracy),
        "overall_stderr": math.sqrt(variance),
        "categories": accuracy,
        "complete": all(len(per_category.get(c, ())) == CATEGORY_SIZES[c] for c in CATEGORIES),
        "data_version": versions[0] if len(versions) == 1 else versions,
        "checker": f"{PACKAGE} {importlib.metadata.version(PACKAGE)}",
    }


register(
    Benchmark(
        name="bfcl_v3",
        source=f"{PACKAGE} package data",
        load=load,
        build_prompt=build_prompt,
        grade=grade,
        aggregate=aggregate,
        # Paper §5.1: the benchmark's own prompt at temperature 0. bfcl-eval stops a multi-turn turn after
        # 20 model steps (MAXIMUM_STEP_LIMIT); the token cap is ours (bfcl-eval leaves it to the model server).
        sampling=Sampling(temperature=0.0, samples=1, max_turns=20, max_tokens=8192, template=NATIVE_TEMPLATE),
        primary_metric="overall",
        environment=lambda doc: MultiTurnEnv(doc) if doc["category"] in MULTI_TURN else None,
        grader_problems=grader_problems,
    )
)
