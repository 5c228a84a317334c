"""A stand-in for the rstar API, for browser tests about the page rather than the model: every answer streams what
the test set (or reasoning words until the test ends the streams), and conversations live in memory.

Its answers speak the API's stream: a chunk with the conversation id, then `choices[0].delta` chunks
(`reasoning_content`, `content`, `code_cell`), a finish reason and `[DONE]`; a finished answer is stored as the
server stores one (content, reasoning_content, code_cells)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StandInApi:
    # The deltas every answer streams, in order; None: reasoning words, one every 10 ms, until `end_streams`.
    answer: list[dict[str, Any]] | None = None
    conversations: list[dict[str, Any]] = field(default_factory=list)  # newest first
    open_streams: int = 0
    generation: int = 0  # an endless answer ends once this moves on

    def end_streams(self) -> None:
        self.generation += 1

    def store(self, messages: list[dict[str, Any]], conversation_id: str | None = None) -> str:
        """Keep an exchange as the server does: into its conversation, or a new one titled by its first message."""
        for conversation in self.conversations:
            if conversation["id"] == conversation_id:
                conversation["messages"] += messages
                return conversation_id
        created = {"id": f"conv-{len(self.conversations) + 1}", "title": messages[0]["content"][:60], "created_at": int(time.time()), "messages": messages}
        self.conversations.insert(0, created)
        return created["id"]

    def app(self):
        from fastapi import FastAPI, HTTPException
        from fastapi.responses import StreamingResponse

        app = FastAPI()

        @app.get("/health")
        def health():
            return {"model": "stand-in"}

        @app.get("/v1/models")
        def models():
            return {"data": [{"id": "stand-in"}]}

        @app.get("/v1/conversations")
        def conversations(limit: int = 50, offset: int = 0):
            return {"data": [{key: c[key] for key in ("id", "title", "created_at")} for c in self.conversations[offset : offset + limit]]}

        @app.get("/v1/conversations/{conversation_id}")
        def conversation(conversation_id: str):
            for found in self.conversations:
                if found["id"] == conversation_id:
                    return found
            raise HTTPException(404)

        @app.post("/v1/chat/completions")
        async def chat(body: dict):
            return StreamingResponse(self._stream(body), media_type="text/event-stream")

        return app

    async def _stream(self, body: dict):
        def chunk(delta: dict | None = None, finish_reason: str | None = None, **top) -> str:
            choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
            return "data: " + json.dumps({**top, "choices": choices}) + "\n\n"

        self.open_streams += 1
        generation = self.generation
        try:
            if self.answer is None:
                for number in range(1, 1_000_000):
                    if self.generation != generation:
                        return
                    yield chunk({"reasoning_content": f"word{number} "})
                    await asyncio.sleep(0.01)
                return
            reply = {"role": "assistant", "content": "", "reasoning_content": "", "code_cells": []}
            for delta in self.answer:
                yield chunk(delta)
                await asyncio.sleep(0.02)
                reply["content"] += delta.get("content", "")
                reply["reasoning_content"] += delta.get("reasoning_content", "")
                if "code_cell" in delta:
                    reply["code_cells"] = [c for c in reply["code_cells"] if c["index"] != delta["code_cell"]["index"]] + [delta["code_cell"]]
            asked = [m for m in body["messages"] if m["role"] == "user"][-1:]
            stored_as = self.store([*asked, reply], body.get("conversation_id"))
            yield chunk({}, "stop", conversation_id=stored_as)
            yield "data: [DONE]\n\n"
        finally:
            self.open_streams -= 1
