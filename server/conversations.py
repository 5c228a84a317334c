"""The conversation store: what the server keeps of each chat exchange, and how the API reads it back.

A conversation is the messages of the latest exchange in it (history + reply; a follow-up naming its
`conversation_id` replaces them) plus the trajectory of every answer ever generated in it, which is what
the JSONL export writes for SFT/RL data.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import uuid4

from sqlalchemy import delete, select
from sqlalchemy.orm import sessionmaker

from rstar.server.chat_template import content_text
from rstar.server.db import Conversation, Message, StoredTrajectory
from rstar.server.trajectory import Trajectory

EXPORT_BATCH = 200  # rows read per query while exporting, so an export never loads the whole table
PURGE_BATCH = 500  # conversations deleted per transaction by the retention purge
PURGE_INTERVAL_S = 3600.0

log = logging.getLogger("rstar.server")


def _title(messages: Sequence[dict[str, Any]]) -> str:
    return content_text(next((m.get("content") for m in messages if m["role"] == "user"), ""))[:120]


class ConversationStore:
    """Conversations by id belong to the API key that stored them (`owner`, a digest of it): another key
    finds none. The list and the export are everyone's, for the admin."""

    def __init__(self, sessions: sessionmaker):
        self.sessions = sessions

    @staticmethod
    def new_id() -> str:
        return uuid4().hex

    def exists(self, conversation_id: str, owner: str | None) -> bool:
        with self.sessions() as session:
            return _owned(session.get(Conversation, conversation_id), owner) is not None

    def save_exchange(
        self,
        model: str,
        messages: list[dict[str, Any]],
        replies: list[dict[str, Any]],
        conversation_id: str | None = None,
        trajectories: Sequence[Trajectory] = (),
        timings: Sequence[dict[str, Any]] = (),
        owner: str | None = None,
    ) -> str:
        """Store the request's messages and the model's replies, with the answers' trajectories.

        conversation_id: an existing conversation gets these messages in place of its own; an unknown id
        becomes the id of a new conversation (a stream announces the id before the answer is stored).
        timings: per trajectory, request-level times (time to first token, duration), kept beside it.
        owner: whose a new conversation is; the caller checked that an existing one is theirs (`exists`).
        """
        with self.sessions() as session:
            conversation = session.get(Conversation, conversation_id) if conversation_id else None
            if conversation is None:
                conversation = Conversation(id=conversation_id or self.new_id(), model=model, title=_title(messages), owner=owner)
                session.add(conversation)
            else:
                conversation.updated_at = datetime.now(timezone.utc)
                conversation.messages.clear()
                session.flush()  # the old rows go before new ones take their positions
            for position, message in enumerate([*messages, *replies]):
                extra = {key: value for key, value in message.items() if key not in ("role", "content") and value is not None}
                conversation.messages.append(Message(position=position, role=message["role"], content=content_text(message.get("content")), extra=extra))
            timings = list(timings) or [{}] * len(trajectories)
            for choice, (trajectory, timing) in enumerate(zip(trajectories, timings)):
                conversation.trajectories.append(
                    StoredTrajectory(
                        choice=choice,
                        model=model,
                        messages=messages,
                        trajectory={**trajectory.to_dict(), "timings": timing},
                        stop_reason=trajectory.stop_reason,
                        num_turns=len(trajectory.turns),
                        num_tool_calls=len(trajectory.tool_calls),
                    )
                )
            session.commit()
            return conversation.id

    async def save_exchange_async(self, *args, **kwargs) -> str:
        # Database I/O stays off the event loop that streams tokens.
        return await asyncio.to_thread(self.save_exchange, *args, **kwargs)

    def list(self, limit: int, offset: int) -> list[dict[str, Any]]:
        """Newest first."""
        with self.sessions() as session:
            rows = session.scalars(select(Conversation).order_by(Conversation.created_at.desc(), Conversation.id).limit(limit).offset(offset))
            return [_summary(c) for c in rows]

    def get(self, conversation_id: str, owner: str | None) -> dict[str, Any] | None:
        with self.sessions() as session:
            conversation = _owned(session.get(Conversation, conversation_id), owner)
            if conversation is None:
                return None
            messages = [{"role": m.role, "content": m.content, **m.extra} for m in conversation.messages]
            return {**_summary(conversation), "messages": messages}

    def delete(self, conversation_id: str, owner: str | None) -> bool:
        with self.sessions() as session:
            if _owned(session.get(Conversation, conversation_id), owner) is None:
                return False
            # Bulk deletes skip the ORM cascade, so children go explicitly (SQLite may have FKs off).
            session.execute(delete(Message).where(Message.conversation_id == conversation_id))
            session.execute(delete(StoredTrajectory).where(StoredTrajectory.conversation_id == conversation_id))
            deleted = session.execute(delete(Conversation).where(Conversation.id == conversation_id)).rowcount
            session.commit()
            return bool(deleted)

    def purge(self, older_than: datetime) -> int:
        """Delete every conversation whose latest exchange is older than `older_than`, with its messages and
        trajectories, a batch per transaction so no transaction grows with the table; how many went."""
        purged = 0
        while True:
            with self.sessions() as session:
                ids = session.scalars(select(Conversation.id).where(Conversation.updated_at < older_than).limit(PURGE_BATCH)).all()
                if not ids:
                    return purged
                session.execute(delete(Message).where(Message.conversation_id.in_(ids)))
                session.execute(delete(StoredTrajectory).where(StoredTrajectory.conversation_id.in_(ids)))
                session.execute(delete(Conversation).where(Conversation.id.in_(ids)))
                session.commit()
            purged += len(ids)

    def export_jsonl(self) -> Iterator[str]:
        """One JSON line per stored trajectory, oldest first, read in batches."""
        last_id = 0
        while True:
            with self.sessions() as session:
                rows = session.scalars(select(StoredTrajectory).where(StoredTrajectory.id > last_id).order_by(StoredTrajectory.id).limit(EXPORT_BATCH)).all()
            if not rows:
                return
            for row in rows:
                record = {
                    "conversation_id": row.conversation_id,
                    "choice": row.choice,
                    "created_at": row.created_at.isoformat(),
                    "model": row.model,
                    "messages": row.messages,
                    **row.trajectory,
                }
                yield json.dumps(record, ensure_ascii=False) + "\n"
            last_id = rows[-1].id


async def purge_periodically(store: ConversationStore, retention_days: float, interval_s: float = PURGE_INTERVAL_S) -> None:
    """Keep only the conversations of the last `retention_days`: purge now, then every `interval_s`, in a
    thread (a purge of many rows must not hold the event loop). A failed purge is logged and tried again."""
    while True:
        cutoff = datetime.now(timezone.utc) - timedelta(days=retention_days)
        try:
            purged = await asyncio.to_thread(store.purge, cutoff)
        except Exception:
            log.exception("the conversation retention purge failed; it runs again in %g s", interval_s)
        else:
            if purged:
                log.info("purged %d conversations older than %g days (setting conversation_retention_days)", purged, retention_days)
        await asyncio.sleep(interval_s)


def _owned(conversation: Conversation | None, owner: str | None) -> Conversation | None:
    """`conversation` if `owner` may see it by id. One without an owner (stored on a server without a key, or
    before conversations had owners) is anyone's, as it was then."""
    if conversation is None or conversation.owner not in (None, owner):
        return None
    return conversation


def _summary(conversation: Conversation) -> dict[str, Any]:
    created = conversation.created_at
    if created.tzinfo is None:  # SQLite hands back naive datetimes; they were written in UTC
        created = created.replace(tzinfo=timezone.utc)
    return {"id": conversation.id, "created_at": int(created.timestamp()), "model": conversation.model, "title": conversation.title}
