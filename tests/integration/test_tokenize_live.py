"""/tokenize on the live server renders exactly the prompt /v1/chat/completions sends for the same body, for
every case of the released template's reference renders, with the server's defaults and with the rStar
template and no built-in tool (where the prompt is the reference render itself)."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import DEFAULT_MODEL_NAME
from tests.released_renders import released_renders

CASES = released_renders()
# Cases whose render our rStar template reproduces to the character (tests/unit/test_tool_protocol.py).
FAITHFUL = {"user_with_tools_generation", "user_no_tools_generation", "system_user_with_tools", "system_user_no_tools",
            "tool_call_then_two_results", "unicode_arguments"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_tokenize_sends_what_chat_sends_for_every_reference_case(live_server, default_tokenizer, name):
    case = CASES[name]
    body = {"model": DEFAULT_MODEL_NAME, "messages": case["messages"], "tools": case["tools"], "add_generation_prompt": case["add_generation_prompt"]}
    with httpx.Client(base_url=live_server.base_url, timeout=120) as http:
        for variant in ({}, {"chat_template": "rstar", "builtin_tools": False}):
            request = body | variant
            chat = http.post("/v1/chat/completions", json=request | {"max_tokens": 1, "temperature": 0, "return_token_ids": True, "store": False})
            tokens = http.post("/tokenize", json=request)
            assert chat.status_code == tokens.status_code == 200, (chat.text, tokens.text)
            assert tokens.json()["tokens"] == chat.json()["prompt_token_ids"], variant
    if name in FAITHFUL:
        assert tokens.json()["tokens"] == default_tokenizer.encode(case["rendered"], add_special_tokens=False)
