"""Wire shapes of the Containers API subset, as the official `openai` client sends and parses them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MemoryLimit = Literal["1g", "4g", "16g", "64g"]  # the values OpenAI's API accepts


class ExpiresAfter(BaseModel):
    anchor: Literal["last_active_at"] = "last_active_at"
    minutes: int = Field(20, ge=1, le=7 * 24 * 60)


class ContainerCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")  # network_policy and skills: the sandbox has no network and no skills

    name: str = Field(..., max_length=256)
    expires_after: ExpiresAfter = Field(default_factory=ExpiresAfter)
    memory_limit: MemoryLimit = "1g"


class Container(BaseModel):
    id: str
    object: Literal["container"] = "container"
    name: str
    created_at: int
    last_active_at: int
    status: Literal["active"] = "active"
    expires_after: ExpiresAfter
    memory_limit: MemoryLimit


class ContainerFile(BaseModel):
    id: str
    object: Literal["container.file"] = "container.file"
    container_id: str
    created_at: int
    bytes: int
    path: str
    source: Literal["user", "assistant"]


class Deleted(BaseModel):
    id: str
    object: str
    deleted: bool = True
