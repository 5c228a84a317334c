"""Wire shapes of the Files API subset, as the official `openai` client sends and parses them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# The purposes an upload may name (the openai client's FilePurpose); here every file is only stored and handed to
# containers, whatever its purpose.
FilePurpose = Literal["assistants", "batch", "fine-tune", "vision", "user_data", "evals"]


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["processed"] = "processed"  # deprecated in OpenAI's API, still sent: a stored file is ready
    expires_at: int | None = None  # never: a file stays until it is deleted


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
