"""OpenAI's cursor lists (`{"object": "list", "data", "first_id", "last_id", "has_more"}`), as the official
client pages them: `after` is the last id of the page before, `order` is by creation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel

Item = TypeVar("Item")


class ListPage(BaseModel, Generic[Item]):
    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool


def page(items: Sequence, limit: int, after: str | None, order: str) -> ListPage:
    """One page of `items` (each with an `id`, oldest first), newest first unless `order` is "asc"."""
    ordered = list(items) if order == "asc" else list(items)[::-1]
    ids = [item.id for item in ordered]
    start = ids.index(after) + 1 if after in ids else 0
    chosen = ordered[start : start + limit]
    return ListPage(data=chosen, first_id=chosen[0].id if chosen else None, last_id=chosen[-1].id if chosen else None, has_more=start + limit < len(ordered))
