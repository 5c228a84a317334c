"""The Containers API subset: containers (create, list, retrieve, delete) and their files (upload, list,
retrieve, content, delete). A container belongs to the API key that made it (`key_owner`); another key's is a 404.

The plain functions run in FastAPI's thread pool, so their file I/O stays off the event loop; the upload is
async to parse the multipart body, and writes the file in a thread; the delete is async to stop the
container's interpreter in the sandbox too.
"""

from __future__ import annotations

import asyncio
import re

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from rstar.server.auth import API_KEY, key_owner
from rstar.server.containers import ContainerStore, stop_interpreter
from rstar.server.cursor_pages import ListPage, page
from rstar.server.file_transfer import download, multipart_upload
from rstar.server.schemas_containers import Container, ContainerCreate, ContainerFile, Deleted

router = APIRouter(prefix="/v1/containers", dependencies=API_KEY)
UPLOAD_PATH = re.compile(r"/v1/containers/[^/]+/files")  # where a body may be as large as a file (limits.BodySizeLimit)


@router.post("")
def create_container(body: ContainerCreate, request: Request) -> Container:
    return _store(request).create(body, key_owner(request))


@router.get("")
def list_containers(request: Request, limit: int = Query(20, ge=1, le=100), after: str | None = None, order: str = Query("desc", pattern="^(asc|desc)$")) -> ListPage[Container]:
    return page(_store(request).list(key_owner(request)), limit, after, order)


@router.get("/{container_id}")
def retrieve_container(container_id: str, request: Request) -> Container:
    return _store(request).get(container_id, key_owner(request))


@router.delete("/{container_id}")
async def delete_container(container_id: str, request: Request) -> Deleted:
    await asyncio.to_thread(_store(request).delete, container_id, key_owner(request))
    if (serving := getattr(request.app.state, "serving", None)) is not None:  # None: no lifespan ran, no sandbox holds anything
        await stop_interpreter(serving.sandbox, container_id)
    return Deleted(id=container_id, object="container.deleted")


@router.post("/{container_id}/files")
async def upload_file(container_id: str, request: Request) -> ContainerFile:
    form, upload = await multipart_upload(request)
    try:
        return await asyncio.to_thread(_store(request).add_file, container_id, key_owner(request), upload.filename, upload.file)
    finally:
        await form.close()


@router.get("/{container_id}/files")
def list_files(container_id: str, request: Request, limit: int = Query(20, ge=1, le=100), after: str | None = None, order: str = Query("desc", pattern="^(asc|desc)$")) -> ListPage[ContainerFile]:
    return page(_store(request).list_files(container_id, key_owner(request)), limit, after, order)


@router.get("/{container_id}/files/{file_id}")
def retrieve_file(container_id: str, file_id: str, request: Request) -> ContainerFile:
    return _store(request).file(container_id, file_id, key_owner(request))


@router.get("/{container_id}/files/{file_id}/content")
def file_content(container_id: str, file_id: str, request: Request) -> StreamingResponse:
    record, content = _store(request).open_file(container_id, file_id, key_owner(request))
    return download(content, record.path.rsplit("/", 1)[-1])


@router.delete("/{container_id}/files/{file_id}")
def delete_file(container_id: str, file_id: str, request: Request) -> Deleted:
    _store(request).delete_file(container_id, file_id, key_owner(request))
    return Deleted(id=file_id, object="container.file.deleted")


def _store(request: Request) -> ContainerStore:
    return request.app.state.containers
