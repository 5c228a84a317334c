"""The conversation store: what the server keeps of each chat exchange."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy.orm import sessionmaker

from rstar.server.db import Conversation, Message


class ConversationStore:
    def __init__(self, sessions: sessionmaker):
        self.sessions = sessions

    def save_exchange(self, model: str, messages: list[dict[str, Any]], replies: list[dict[str, Any]]) -> str:
        """Store the request's messages and the model's replies (one per choice) as a new conversation."""
        with self.sessions() as session:
            first_user = next((m["content"] for m in messages if m["role"] == "user"), "")
            conversation = Conversation(model=model, title=first_user[:120])
            for position, message in enumerate([*messages, *replies]):
                extra = {key: value for key, value in message.items() if key not in ("role", "content") and value is not None}
                conversation.messages.append(Message(position=position, role=message["role"], content=message.get("content") or "", extra=extra))
            session.add(conversation)
            session.commit()
            return conversation.id

    async def save_exchange_async(self, model: str, messages: list[dict[str, Any]], replies: list[dict[str, Any]]) -> str:
        # Database I/O stays off the event loop that streams tokens.
        return await asyncio.to_thread(self.save_exchange, model, messages, replies)
