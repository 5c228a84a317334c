"""Where benchmark data comes from: a Hugging Face dataset id by default, or a local directory override.

The local layout is the one in `shared/data/` (one folder per benchmark, original file names), so
`data_dir` may name either that root or the benchmark's own folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


class DataUnavailable(RuntimeError):
    """Neither the default source nor a local copy could be read."""


def local_file(data_dir: Path, folder: str, filename: str) -> Path:
    """`data_dir/folder/filename`, or `data_dir/filename` when data_dir is already the benchmark's folder."""
    data_dir = Path(data_dir)
    candidates = [data_dir / folder / filename, data_dir / filename]
    for path in candidates:
        if path.is_file():
            return path
    raise DataUnavailable(f"no {filename} under {data_dir} (looked for {' and '.join(map(str, candidates))})")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def hf_rows(benchmark: str, hf_id: str, split: str, config: str | None = None) -> list[dict[str, Any]]:
    """All rows of one split of a Hugging Face dataset, or DataUnavailable naming the id and the override."""
    try:
        import datasets

        return list(datasets.load_dataset(hf_id, config, split=split))
    except Exception as exc:  # no network, gated dataset, missing `datasets`: all mean "use a local copy"
        where = hf_id + (f" (config {config})" if config else "")
        raise DataUnavailable(
            f"{benchmark}: could not load the Hugging Face dataset {where}: {type(exc).__name__}: {exc}. "
            f"Pass a local copy instead: data_dir=<dir> (CLI: --data-dir <dir>), a directory laid out like "
            f"shared/data/ (see its SOURCE.md files)."
        ) from exc
