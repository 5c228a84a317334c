"""The citation rule (server/citations.py): named, written or read files are cited, at their first mention."""

from __future__ import annotations

from rstar.server.citations import file_citations, first_mention
from rstar.server.schemas_containers import ContainerFile


def _file(name: str, size: int = 3, source: str = "user") -> ContainerFile:
    return ContainerFile(id=f"cfile_{name}", container_id="cntr_x", created_at=0, bytes=size, path=f"/mnt/data/{name}", source=source)


def test_a_mention_spans_its_longest_form_and_a_bare_name_needs_an_extension():
    assert first_mention("see sandbox:/mnt/data/a.csv", "/mnt/data/a.csv") == (4, 27)
    assert first_mention("in /mnt/data/a.csv", "/mnt/data/a.csv") == (3, 18)
    assert first_mention("a.csv it is", "/mnt/data/a.csv") == (0, 5)
    assert first_mention("a bare a", "/mnt/data/a") == (0, 0)


def test_files_named_written_or_read_are_cited_and_the_rest_are_not():
    files = [_file("named.txt"), _file("made.png", source="assistant"), _file("read.csv"), _file("idle.csv"), _file("grown.txt", 9)]
    before = {"cfile_named.txt": 3, "cfile_read.csv": 3, "cfile_idle.csv": 3, "cfile_grown.txt": 3}
    text = "Done: named.txt."
    cited = file_citations(text, "cntr_x", files, before, ["open('/mnt/data/read.csv')"])
    assert [(a["filename"], a["start_index"], a["end_index"]) for a in cited] == [("grown.txt", 0, 0), ("made.png", 0, 0), ("read.csv", 0, 0), ("named.txt", 6, 15)]
    assert {a["type"] for a in cited} == {"container_file_citation"} and {a["container_id"] for a in cited} == {"cntr_x"}
