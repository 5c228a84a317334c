"""Files in the chat: what a message attaches goes into the conversation's container (made once, on the first
attachment), where the model's cells see it at /mnt/data; what the code writes there is fetched back for the
page to offer as downloads. All of it through the UI's API client: the API key stays on the UI's side."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rstar.ui.client import ApiClient

CONTAINER_NAME = "chat"


async def attach(client: ApiClient, container_id: str | None, paths: list[str]) -> tuple[str, list[str]]:
    """Upload the files at `paths` into the container (a new one when `container_id` is None): its id, and the
    files' paths as the code sees them."""
    container_id = container_id or await client.create_container(CONTAINER_NAME)
    seen = [(await client.upload_to_container(container_id, Path(path)))["path"] for path in paths]
    return container_id, seen


EXPIRED = ("This conversation's files expired with its container (it is removed after its idle minutes): "
           "the code no longer sees them. Attach them again to use them.")


async def live_container(client: ApiClient, container_id: str | None) -> tuple[str | None, str]:
    """The conversation's container if it is still there, else None and the notice saying its files are gone."""
    if container_id is None or await client.container_exists(container_id):
        return container_id, ""
    return None, EXPIRED


def attachment_note(seen: list[str]) -> str:
    """The line a message with attachments carries, so the model knows where its files are."""
    return "Attached: " + ", ".join(f"`{path}`" for path in seen)


async def file_sizes(client: ApiClient, container_id: str) -> dict[str, int]:
    """Each file of the container by id, with its size: what an answer's written files are told apart from."""
    return {f["id"]: f["bytes"] for f in await client.container_files(container_id)}


async def fetch_written(client: ApiClient, container_id: str, before: dict[str, int], directory: Callable[[], Path]) -> list[Path]:
    """The files the code wrote into the container since `before` (new ones, and ones whose size changed),
    downloaded under their own names into `directory()` (called only when there are some), for the page to serve."""
    written = [f for f in await client.container_files(container_id) if f["source"] == "assistant" and before.get(f["id"]) != f["bytes"]]
    if not written:
        return []
    into = directory()
    fetched = []
    for record in written:
        target = into / Path(record["path"]).name
        target.write_bytes(await client.container_file_content(container_id, record["id"]))
        fetched.append(target)
    return fetched
