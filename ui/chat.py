"""The Chat tab: stream answers with their reasoning and code cells, stop them, keep and reload conversations,
attach files for the code and download what it wrote (ui/attachments.py).

The tab's state is one dict: the stored conversation's id (None until the server stores the first
exchange), its container's id (None until a message attaches a file), the full messages (with reasoning and
cells, for export) and the rendered chat so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timezone
from typing import Any, TypeVar

import gradio as gr

from rstar.ui.attachments import attach, attachment_note, fetch_written, file_sizes, live_container
from rstar.ui.client import ApiClient, ApiError, StreamEvent
from rstar.ui.render import AssistantTurn, conversation_messages, download_messages, turn_messages
from rstar.ui.scratch import Scratch

log = logging.getLogger("rstar.ui")

# Problems the embedded default model answers by running a cell, checked at the chat's default temperature
# (0.6): a 135M model handles the sentence shapes it was tuned on (rl/sft/data.py), not olympiad problems.
EXAMPLES = [
    "What is 4821 times 937?",
    "How many positive divisors does 5040 have?",
    "Solve for x: 7x + 12 = 215.",
    "What is the remainder when 7^123 is divided by 1000?",
]

# Inline $...$ as well as display math: the model writes both (Gradio's default only knows $$...$$).
LATEX_DELIMITERS = [
    {"left": "$$", "right": "$$", "display": True},
    {"left": "\\[", "right": "\\]", "display": True},
    {"left": "$", "right": "$", "display": False},
    {"left": "\\(", "right": "\\)", "display": False},
]

# The class of every chat of answers, which the page's stylesheet (ui/app.py) styles.
CHAT_CLASS = "answers"


def answers_chatbot(**options: Any) -> gr.Chatbot:
    """A chat of the model's answers (the Chat tab's and an eval sample's): no label band above it, math rendered,
    and a copy button per message only (the stylesheet keeps the cells' and the answer's, CHAT_CLASS)."""
    return gr.Chatbot(
        show_label=False,
        latex_delimiters=LATEX_DELIMITERS,
        buttons=["copy"],
        feedback_options=None,
        layout="panel",
        elem_classes=[CHAT_CLASS],
        **options,
    )


T = TypeVar("T")

# The page re-renders the whole growing message on every update it gets (Markdown, code highlighting, LaTeX),
# so one update per streamed token costs the browser O(length) per token and falls behind a fast stream on a
# slow CPU. An answer is sent to the page at most every RENDER_INTERVAL_S, each update carrying everything
# that arrived; past about 27K characters the interval grows with the answer's length, so that rendering costs
# the page the same share of a core per second however long the answer gets.
RENDER_INTERVAL_S = 1 / 15
RENDER_SECONDS_PER_CHARACTER = 2.5e-6


def render_interval_s(turn: AssistantTurn, floor_s: float) -> float:
    """How long the answer's next update of the page waits at least (0 with a floor of 0: every event)."""
    return max(floor_s, RENDER_SECONDS_PER_CHARACTER * turn.size) if floor_s > 0 else 0.0


_END = object()


async def batches_until_set(stop: asyncio.Event, events: AsyncIterator[T], interval_s: Callable[[], float]) -> AsyncIterator[list[T]]:
    """The items of `events` in batches, at most one batch per `interval_s()` seconds, until `stop` is set.

    A batch goes out as soon as its interval has passed, whether or not more items come, so a quiet stream (a
    long tool call) never holds back what already arrived; what arrived before a stop or a failure of the
    stream still goes out. `stop` is watched even while the next item is awaited; then the stream is closed,
    which makes the server abort the generation. An interval of 0 yields every item on its own.
    """
    loop = asyncio.get_running_loop()
    stopped = asyncio.ensure_future(stop.wait())
    batch: list[T] = []
    sent_at = -float("inf")
    try:
        async with contextlib.aclosing(events):
            following = asyncio.ensure_future(anext(events, _END))
            try:
                while True:
                    wait_s = max(sent_at + interval_s() - loop.time(), 0) if batch else None
                    await asyncio.wait({following, stopped}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                    if following.done() and not stop.is_set():
                        if following.exception() is not None and batch:
                            yield batch
                            batch = []
                        item = following.result()
                        if item is _END:
                            break
                        batch.append(item)
                        following = asyncio.ensure_future(anext(events, _END))
                        if loop.time() < sent_at + interval_s():
                            continue
                    elif stop.is_set():
                        break
                    yield batch
                    batch, sent_at = [], loop.time()
                if batch:
                    yield batch
            finally:
                following.cancel()
                await asyncio.wait({following})
                if not following.cancelled():
                    following.exception()  # retrieved: a stream that failed after a stop is not an error
    finally:
        stopped.cancel()


# How long a Stop that found no answer to end still counts, for the send whose arming it overtook on the way.
EARLY_STOP_HOLD_S = 0.5

# Every answer's number in this process: the end-of-answer signal names it, so a page (or a browser test)
# tells this answer's end from the previous one's.
ANSWER_NUMBERS = itertools.count(1)


def answer_signal(number: int, phase: str) -> str:
    """The hidden `#answer-state` element's text: `<answer number> <streaming|done|stopped>`."""
    return f"{number} {phase}"


def new_state() -> dict[str, Any]:
    return {"conversation_id": None, "container_id": None, "messages": [], "display": []}


def notice(message: str) -> str:
    return f"⚠ {message}" if message else ""


async def listed_choices(
    listing: Awaitable[Any], to_choices: Callable[[Any], list[tuple[str, str]]], selected: str | None, empty: str = "", first: bool = False
) -> tuple[Any, str]:
    """A list of choices (a run dropdown, the conversations) refreshed from an API listing, and the notice to
    show beside it: the choices with `selected` kept while it is still listed (else the first one when `first`,
    else none); the API's error, or `empty` when nothing is listed."""
    try:
        choices = to_choices(await listing)
    except ApiError as exc:
        return gr.update(), notice(str(exc))
    ids = [value for _, value in choices]
    value = selected if selected in ids else (ids[0] if first and ids else None)
    return gr.update(choices=choices, value=value), "" if choices else empty


def request_payload(
    state: dict[str, Any], text: str, model: str, temperature: float, max_tokens: int, max_turns: int, tools: bool, system: str, prefix: str = ""
) -> dict[str, Any]:
    """The /v1/chat/completions body for the next user message; the history goes as role + content only.

    A `prefix` is the start of the answer, given for the model to continue (vLLM's continue_final_message);
    a complete <tool_call> in it makes the server run that call first. A conversation with a container runs
    its cells there (the `container` extension field), every message after the first attachment.
    """
    messages = [{"role": "system", "content": system}] if system and system.strip() else []
    messages += [{"role": m["role"], "content": m.get("content") or ""} for m in state["messages"] if m["role"] in ("user", "assistant")]
    messages.append({"role": "user", "content": text})
    if prefix:
        messages.append({"role": "assistant", "content": prefix})
    payload = {
        "model": model or "default",
        "messages": messages,
        "temperature": float(temperature),
        "max_tokens": int(max_tokens),
        "max_turns": int(max_turns),
        "builtin_tools": bool(tools),
    }
    if prefix:
        payload["continue_final_message"] = True
    if state["conversation_id"]:
        payload["conversation_id"] = state["conversation_id"]
    if state.get("container_id"):
        payload["container"] = state["container_id"]
    return payload


def _assistant_message(turn: AssistantTurn) -> dict[str, Any]:
    cells = [value for kind, value in turn.segments if kind == "cell"]
    return {"role": "assistant", "content": turn.content, "reasoning_content": turn.reasoning, "code_cells": cells}


def apply_event(turn: AssistantTurn, event: StreamEvent) -> None:
    """One streamed event of the answer into the turn it builds."""
    if event.kind == "reasoning":
        turn.add_reasoning(event.value)
    elif event.kind == "content":
        turn.add_content(event.value)
    elif event.kind == "cell":
        turn.update_cell(event.value)
    elif event.kind == "finished":
        turn.finish_reason = event.value


def conversation_choices(conversations: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The conversation list's (label, id) pairs; the API gives `created_at` in unix seconds, as OpenAI's objects do."""

    def when(created: int) -> str:
        return datetime.fromtimestamp(created, timezone.utc).strftime("%Y-%m-%d %H:%M")

    return [(f"{(c.get('title') or '(untitled)')[:60]} · {when(c['created_at'])}", c["id"]) for c in conversations]


def build_chat_tab(client: ApiClient, demo: gr.Blocks, scratch: Scratch, render_floor_s: float = RENDER_INTERVAL_S) -> None:
    """Lay out the tab inside the current Blocks context and wire its events (and `demo`'s page load).

    An answer updates the page at most once per `render_interval_s(turn, render_floor_s)` (0: every event)."""
    state = gr.State(new_state())
    with gr.Row():
        with gr.Column(scale=1, min_width=260):
            new_chat = gr.Button("+ New chat", elem_id="new-chat")
            conversations = gr.Radio(label="Conversations", choices=[], value=None, elem_id="conversations")
            with gr.Row():
                refresh = gr.Button("↻ Refresh", size="sm", elem_id="refresh-conversations")
                delete = gr.Button("Delete", size="sm", variant="stop", elem_id="delete-conversation")
            export = gr.Button("Export as JSON", size="sm", elem_id="export-conversation")
            export_file = gr.File(label="Exported conversation", visible=False, elem_id="export-file")
        with gr.Column(scale=4):
            alert = gr.Markdown(elem_id="chat-notice")
            chatbot = answers_chatbot(
                elem_id="chatbot",
                height=620,
                placeholder="Ask a math question: the model reasons, writes Python, runs it in the sandbox and answers.",
            )
            with gr.Row():
                box = gr.Textbox(show_label=False, placeholder="Your message (Enter to send)", scale=8, elem_id="chat-input", autofocus=True)
                send = gr.Button("Send", variant="primary", scale=1, elem_id="send")
                stop = gr.Button("Stop", variant="stop", scale=1, elem_id="stop")
            # Sent with the next message into the conversation's container, where the code reads them at /mnt/data.
            attachments = gr.File(label="Attach files for the code", file_count="multiple", height=120, elem_id="attachments")
            # Set in the same update as an answer's first and last message, so the page says when an answer
            # has ended without anyone guessing from a quiet period.
            answer_state = gr.HTML("", visible="hidden", elem_id="answer-state")
            gr.Examples(EXAMPLES, inputs=box, label="Examples")
            with gr.Accordion("Settings", open=False, elem_id="chat-settings"):
                with gr.Row():
                    model = gr.Dropdown(label="Model", choices=[], value=None, allow_custom_value=True, elem_id="model")
                    temperature = gr.Slider(0.0, 2.0, value=0.6, step=0.05, label="Temperature", elem_id="temperature")
                    max_tokens = gr.Number(value=1024, minimum=1, precision=0, label="Max tokens", elem_id="max-tokens")
                    max_turns = gr.Number(value=10, minimum=1, precision=0, label="Max turns", elem_id="max-turns")
                    tools = gr.Checkbox(value=True, label="Python tool", elem_id="tools")
                system = gr.Textbox(label="System prompt", lines=2, placeholder="(the server's default)", elem_id="system-prompt")
                prefix = gr.Textbox(
                    label="Answer prefix (advanced)",
                    lines=2,
                    placeholder="Text the answer starts with; a complete <tool_call>...</tool_call> in it runs first.",
                    elem_id="answer-prefix",
                )

    # The stop request of each page session's running answer (Gradio's session hash -> event); a page has at
    # most one, so its conversation grows one exchange at a time. `armed` holds the stop request of an answer
    # sent but not yet started (its send's first, unqueued step makes it), so a Stop pressed in between counts.
    # The browser sends a Send's arming and a Stop on connections of their own, so a Stop pressed right after Send
    # can reach the server first and find nothing to stop: `early` keeps when such a stop came, and an arming
    # within EARLY_STOP_HOLD_S of it starts stopped.
    stops: dict[str, asyncio.Event] = {}
    armed: dict[str, asyncio.Event] = {}
    early: dict[str, float] = {}

    async def arm(request: gr.Request):
        stop = armed[request.session_hash] = asyncio.Event()
        if time.monotonic() - early.pop(request.session_hash, float("-inf")) < EARLY_STOP_HOLD_S:
            stop.set()

    async def respond(text, attached, state, model, temperature, max_tokens, max_turns, tools, system, prefix, request: gr.Request):
        stop = armed.pop(request.session_hash, None) or asyncio.Event()
        if not text.strip():
            yield gr.skip(), state, gr.skip(), "", gr.skip(), gr.skip()
            return
        if request.session_hash in stops:  # the text and files stay, to send once the answer has ended
            yield gr.skip(), gr.skip(), gr.skip(), notice("An answer is still coming: wait for it, or press Stop, then send."), gr.skip(), gr.skip()
            return
        try:  # before anything shows: a refused upload leaves the message and its files to send again
            container_id, expired = await live_container(client, state["container_id"])
            container_id, seen = await attach(client, container_id, attached) if attached else (container_id, [])
        except ApiError as exc:
            yield gr.skip(), gr.skip(), gr.skip(), notice(f"The files were not attached: {exc}"), gr.skip(), gr.skip()
            return
        state = {**state, "container_id": container_id}
        if seen:
            text = f"{text}\n\n{attachment_note(seen)}"
        payload = request_payload(state, text, model, temperature, max_tokens, max_turns, tools, system, prefix or "")
        user = {"role": "user", "content": text}
        shown = [*state["display"], user]
        turn = AssistantTurn()
        number = next(ANSWER_NUMBERS)
        stops[request.session_hash] = stop
        # Each yield carries the state as it stands, so a stop keeps the partial answer in the history.
        progress = {**state, "messages": [*state["messages"], user], "display": shown}
        yield shown + turn_messages(turn, streaming=True), progress, "", notice(expired), answer_signal(number, "streaming"), None
        stored_as = None
        downloads = []
        try:
            before = await file_sizes(client, container_id) if container_id else {}
            async for batch in batches_until_set(stop, client.stream_chat(payload), lambda: render_interval_s(turn, render_floor_s)):
                for event in batch:
                    if event.kind == "started":
                        stored_as = event.value
                    else:
                        apply_event(turn, event)
                progress = {**progress, "messages": [*state["messages"], user, _assistant_message(turn)], "display": shown + turn_messages(turn)}
                yield shown + turn_messages(turn, streaming=True), progress, gr.skip(), gr.skip(), gr.skip(), gr.skip()
            # The server stores the exchange once the answer is complete; a stopped one may not exist there,
            # so only a finished stream's id is sent back next time.
            if not stop.is_set():
                progress["conversation_id"] = stored_as or progress["conversation_id"]
            if container_id:
                downloads = await fetch_written(client, container_id, before, scratch.new_dir)
        except ApiError as exc:
            turn.error = str(exc)
        except Exception as exc:  # the page gets one line; the log keeps the traceback
            log.exception("chat stream failed")
            turn.error = f"Unexpected error: {type(exc).__name__}: {exc}"
        finally:
            if stops.get(request.session_hash) is stop:
                del stops[request.session_hash]
        turn.stopped = stop.is_set()
        display = shown + turn_messages(turn) + download_messages(downloads)
        progress = {**progress, "messages": [*state["messages"], user, _assistant_message(turn)], "display": display}
        yield progress["display"], progress, gr.skip(), notice(expired), answer_signal(number, "stopped" if stop.is_set() else "done"), gr.skip()

    async def stop_answer(request: gr.Request):
        session = request.session_hash
        if session not in stops and session not in armed:
            now = time.monotonic()
            for stale in [other for other, at in early.items() if now - at >= EARLY_STOP_HOLD_S]:
                del early[stale]
            early[session] = now
        for pending in (stops, armed):
            if session in pending:
                pending[session].set()

    async def list_conversations(state):
        """The stored conversations, newest first, the open one selected."""
        return await listed_choices(client.conversations(), conversation_choices, state["conversation_id"])

    async def open_conversation(conversation_id):
        if not conversation_id:
            return gr.skip(), gr.skip(), notice("Choose a stored conversation first.")
        try:
            stored = await client.conversation(conversation_id)
        except ApiError as exc:
            return gr.skip(), gr.skip(), notice(str(exc))
        messages = [m for m in stored["messages"] if m["role"] != "system"]
        display = conversation_messages(messages)
        return display, {**new_state(), "conversation_id": stored["id"], "messages": messages, "display": display}, ""

    async def delete_conversation(conversation_id, state):
        if not conversation_id:
            return gr.skip(), gr.skip(), gr.skip(), notice("Choose a stored conversation first.")
        try:
            await client.delete_conversation(conversation_id)
            choices = conversation_choices(await client.conversations())
        except ApiError as exc:
            return gr.skip(), gr.skip(), gr.skip(), notice(str(exc))
        if state["conversation_id"] == conversation_id:  # the open chat no longer exists on the server
            state = new_state()
        return gr.update(choices=choices, value=None), state["display"], state, ""

    def export_conversation(state, model):
        if not state["messages"]:
            return gr.update(visible=False), notice("Nothing to export yet.")
        record = {"conversation_id": state["conversation_id"], "model": model, "messages": state["messages"]}
        name = state["conversation_id"] or "conversation"
        path = scratch.new_dir() / f"rstar-{name}.json"
        path.write_text(json.dumps(record, indent=2, ensure_ascii=False), encoding="utf-8")
        return gr.update(value=str(path), visible=True), ""

    settings = [model, temperature, max_tokens, max_turns, tools, system, prefix]
    outputs = [chatbot, state, box, alert, answer_state, attachments]
    # Progress shows on the chat only: the input box stays usable for the next message. Gradio runs one event of
    # a listener at a time unless told otherwise; an answer mostly waits on the API, which batches answers, so
    # every page's answer streams at once (concurrency_limit=None) instead of queueing behind other pages'.
    # A send first arms its answer's stop request, unqueued, then starts the answer. A send during an answer
    # reaches `respond` (trigger_mode "multiple"; Gradio's "once" drops the click without a word), which says
    # why it waits.
    answering = dict(fn=respond, inputs=[box, attachments, state, *settings], outputs=outputs, show_progress_on=chatbot, concurrency_limit=None, trigger_mode="multiple")
    submitted = box.submit(arm, None, None, queue=False, trigger_mode="multiple").then(**answering)
    clicked = send.click(arm, None, None, queue=False, trigger_mode="multiple").then(**answering)
    for event in (submitted, clicked):
        event.then(list_conversations, state, [conversations, alert])
    # Stop asks the running answer to end rather than cancelling its task (Gradio's `cancels`): the answer then
    # closes its HTTP stream, so the server aborts the generation, and ends with the partial answer shown. A
    # cancelled task ends the event without a last update, and Gradio may then show "Error" over the chat.
    stop.click(stop_answer, None, None, queue=False)
    new_chat.click(lambda: ([], new_state(), None, ""), None, [chatbot, state, conversations, alert])
    refresh.click(list_conversations, state, [conversations, alert])
    conversations.input(open_conversation, conversations, [chatbot, state, alert])
    delete.click(delete_conversation, [conversations, state], [conversations, chatbot, state, alert])
    export.click(export_conversation, [state, model], [export_file, alert])

    async def on_load(state):
        """Fill the model list and the conversations; say so on the page if the server is not there."""
        try:
            names = await client.models()
        except ApiError as exc:
            return gr.update(), gr.update(), notice(str(exc))
        listed, said = await list_conversations(state)
        return gr.update(choices=names, value=names[0] if names else None), listed, said

    demo.load(on_load, state, [model, conversations, alert])
