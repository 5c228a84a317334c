"""The stored conversations: the list and the export read every client's conversations, so they take the
admin key; one conversation, by its id, takes the API key it was stored with.

The routes are plain functions: FastAPI runs them in its thread pool, so database I/O stays off the event
loop that streams tokens.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from rstar.server.auth import ADMIN_KEY, API_KEY, key_owner
from rstar.server.conversations import ConversationStore
from rstar.server.errors import APIError

router = APIRouter(prefix="/v1/conversations")


@router.get("", dependencies=ADMIN_KEY)
def list_conversations(request: Request, limit: int = Query(20, ge=1, le=200), offset: int = Query(0, ge=0)) -> dict:
    return {"object": "list", "data": _store(request).list(limit, offset)}


@router.get("/export.jsonl", dependencies=ADMIN_KEY)
def export_conversations(request: Request) -> StreamingResponse:
    # A sync iterator: Starlette runs it in a thread pool, off the event loop.
    return StreamingResponse(_store(request).export_jsonl(), media_type="application/x-ndjson")


@router.get("/{conversation_id}", dependencies=API_KEY)
def get_conversation(conversation_id: str, request: Request) -> dict:
    found = _store(request).get(conversation_id, key_owner(request))
    if found is None:
        raise _no_conversation(conversation_id)
    return found


@router.delete("/{conversation_id}", dependencies=API_KEY)
def delete_conversation(conversation_id: str, request: Request) -> dict:
    if not _store(request).delete(conversation_id, key_owner(request)):
        raise _no_conversation(conversation_id)
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def _store(request: Request) -> ConversationStore:
    return request.app.state.serving.store


def _no_conversation(conversation_id: str) -> APIError:
    return APIError(404, f"No conversation with id {conversation_id!r}.", "conversation_id", "conversation_not_found")
