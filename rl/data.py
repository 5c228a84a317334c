"""Training problems: a JSONL file (or a directory holding one) or a Hugging Face dataset id, each row a
problem with a verifiable answer.

Accepted row shapes: `problem` + `answer` (MATH, MATH-500, `rstar rl make-sft-data`'s files), or `question` +
`answer` where the answer may be a GSM8K solution ending in `#### N`. A row without an answer cannot be
rewarded, so it is refused with its line number rather than silently scoring 0 forever.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_GSM8K_FINAL = re.compile(r"\n####\s*(.+?)\s*$", re.DOTALL)


class DataError(ValueError):
    """Training data that cannot be used; the message names the file and the row."""


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str


def problem_from_row(row: object, where: str) -> Problem:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    text = row.get("problem", row.get("question"))
    if not isinstance(text, str) or not text.strip():
        raise DataError(f"{where}: no 'problem' (or 'question') text")
    answer = row.get("answer")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise DataError(f"{where}: no 'answer'; every training problem needs one to be rewarded")
    if (final := _GSM8K_FINAL.search(answer)) is not None:
        answer = final.group(1)
    identifier = row.get("id", row.get("unique_id", row.get("idx")))
    return Problem(id=str(identifier) if identifier is not None else where, problem=text, answer=answer.strip())


def load_problems(source: str) -> list[Problem]:
    """Every problem of a JSONL file, a directory with exactly one, or a Hugging Face dataset ("owner/name[:split]")."""
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if len(files) != 1:
            raise DataError(f"{path}: expected one .jsonl file in the directory, found {len(files)}; name the file")
        path = files[0]
    if path.is_file():
        return _load_jsonl(path)
    if "/" in source and not source.startswith((".", "/")):
        return _load_hub(source)
    raise DataError(f"{source}: no such file or directory")


def jsonl_rows(path: str | Path, error: type[ValueError] = DataError) -> Iterator[tuple[str, object]]:
    """(where, decoded row) for each non-blank line; `where` is "path:line" for messages. Bad JSON raises `error`."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{where}: not valid JSON ({exc.msg})") from None


def _load_jsonl(path: Path) -> list[Problem]:
    problems = [problem_from_row(row, where) for where, row in jsonl_rows(path)]
    if not problems:
        raise DataError(f"{path}: no problems in the file")
    return problems


def _load_hub(source: str) -> list[Problem]:
    name, _, split = source.partition(":")
    try:
        from datasets import load_dataset

        dataset = load_dataset(name, split=split or "train")
    except Exception as exc:  # missing package, no network, unknown id: all mean "cannot load it here"
        raise DataError(f"{source}: could not load the Hugging Face dataset ({type(exc).__name__}: {exc}); pass a local JSONL file") from None
    return [problem_from_row(dict(row), f"{source} row {index}") for index, row in enumerate(dataset)]
