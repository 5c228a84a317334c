"""The code interpreter's `{"type": "auto", "file_ids": [...]}`: a fresh container of the caller's key holding
those Files API files, for the cells of one request, as OpenAI makes one. It is an ordinary container after
that (listed, expiring after its default 20 idle minutes, counted against the key's max_per_key)."""

from __future__ import annotations

from rstar.server.containers import ContainerStore
from rstar.server.errors import naming_field
from rstar.server.files import FileStore
from rstar.server.schemas_containers import Container, ContainerCreate
from rstar.server.schemas_responses import AutoContainer

AUTO_CONTAINER_NAME = "code_interpreter auto"


def container_with_files(containers: ContainerStore, files: FileStore, auto: AutoContainer, owner: str | None, field: str) -> Container:
    """Make the container and copy the files in. Refusals name the request's field (`field` is the tool's
    `tools.N.container`): an unknown or another key's file, or one the container's caps refuse, is
    `field.file_ids.K`, and a container the key may not make `field`. Every file is checked before anything is
    made, and a container that could not take them all is removed again."""
    for k, file_id in enumerate(auto.file_ids):
        files.get(file_id, owner, f"{field}.file_ids.{k}")
    with naming_field(field):
        container = containers.create(ContainerCreate(name=AUTO_CONTAINER_NAME, memory_limit=auto.memory_limit or "1g"), owner)
    try:
        for k, file_id in enumerate(auto.file_ids):
            with naming_field(f"{field}.file_ids.{k}"):
                record, content = files.open(file_id, owner)
                with content:
                    containers.add_file(container.id, owner, record.filename, content)
    except BaseException:
        containers.delete(container.id, owner)
        raise
    return container
