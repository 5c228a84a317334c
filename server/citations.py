"""Which container files a Responses answer cites (`container_file_citation` annotations on its output_text).

The rule: a file of the container is cited when the answer's text names it (its `/mnt/data/` path, with or
without OpenAI's `sandbox:` prefix, or its bare file name when that has an extension, so a file called `a`
is not cited by every "a"), when a cell of this response wrote it (new or
changed), or when a cell's code names it (the code read it). The annotation spans the file's first mention
in the text; a cited file the text does not name spans 0..0, as OpenAI's own annotations do for a file its
code made but the answer does not link.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rstar.server.schemas_containers import ContainerFile


def first_mention(text: str, path: str) -> tuple[int, int]:
    """(start, end) of the file's first mention in `text`: the longest form found there; (0, 0) when none is."""
    name = path.rsplit("/", 1)[-1]
    for form in ("sandbox:" + path, path, name if "." in name else None):
        if form and (start := text.find(form)) >= 0:
            return start, start + len(form)
    return 0, 0


def file_citations(text: str, container_id: str, files: Iterable[ContainerFile], before: Mapping[str, int], codes: Iterable[str]) -> list[dict]:
    """The annotations for `files` (the container's after the answer); `before`: file id -> bytes before it."""
    codes = list(codes)
    annotations = []
    for file in files:
        name = file.path.rsplit("/", 1)[-1]
        written = before.get(file.id) != file.bytes
        start, end = first_mention(text, file.path)
        if end or written or any(file.path in code or ("." in name and name in code) for code in codes):
            annotations.append({"type": "container_file_citation", "container_id": container_id, "file_id": file.id,
                                "filename": name, "start_index": start, "end_index": end})
    return sorted(annotations, key=lambda a: (a["start_index"], a["filename"]))
