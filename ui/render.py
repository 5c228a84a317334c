"""Pure rendering: code cells, assistant turns, final answers, trajectories and score tables as Markdown / chat
messages.

No Gradio and no HTTP here, so every shape the page shows is unit-tested on plain data. Chat messages are
the dicts `gr.Chatbot` takes: a message with `metadata.title` renders as a collapsible block (used for the
reasoning and the raw answer); code cells and answers are plain messages so they stay in view.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Cell statuses the server sends (`delta.code_cell.status`) and how the page names them.
# Symbols every common font has (no emoji), so a page on a bare server looks the same as on a laptop.
STATUS_LABELS = {
    "running": "running…",
    "ok": "✓ ok",
    "error": "✗ error",
    "timeout": "✗ timed out",
    "memory": "✗ memory limit",
    "output_limit": "✗ output limit",
    "queue_timeout": "⚠ sandbox busy",
    "invalid_input": "⚠ invalid call",
    "internal_error": "⚠ sandbox failure",
}

# Beyond these an output block shows its head and hides the rest behind a "show all" toggle, so one
# runaway print cannot push the conversation off the screen.
MAX_LINES = 20
MAX_CHARS = 2000

# Marks on a cell's and a note's message for the page's stylesheet (ui/app.py): Gradio gives every message a copy
# button and every code block another, and the page keeps one per cell (its code's) and one per answer.
CELL_CLASS = "chat-cell"
NOTE_CLASS = "chat-note"

# Stored/streamed text may still carry the raw call the model wrote; the cell shows it instead.
_TOOL_CALL = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)


def fence(text: str, lang: str = "") -> str:
    """A fenced code block that survives backticks inside `text` (the fence is longer than any run in it)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip(chr(10))}\n{ticks}"


def output_block(text: str, max_lines: int = MAX_LINES, max_chars: int = MAX_CHARS) -> str:
    """Output as a fenced block; a long one shows its head, with the whole text in a collapsed <details>."""
    lines = text.splitlines()
    if len(lines) <= max_lines and len(text) <= max_chars:
        return fence(text)
    head = "\n".join(lines[:max_lines])[:max_chars]
    return (
        f"{fence(head)}\n\n<details><summary>Show all {len(lines)} lines ({len(text)} characters)</summary>\n\n"
        f"{fence(text)}\n\n</details>"
    )


def cell_title(cell: dict[str, Any]) -> str:
    status = cell.get("status") or "running"
    parts = [f"Python cell {int(cell.get('index', 0)) + 1}", STATUS_LABELS.get(status, status)]
    if cell.get("duration_s") is not None and status != "running":
        parts.append(f"{cell['duration_s']:.2f} s")
    return " · ".join(parts)


def cell_markdown(cell: dict[str, Any]) -> str:
    """A code cell: title line, highlighted code, then stdout/stderr and its figures once it has them."""
    blocks = [f'<span class="{CELL_CLASS}">**{cell_title(cell)}**</span>', fence(cell.get("code") or "", "python")]
    for stream in ("stdout", "stderr"):
        if cell.get(stream):
            blocks.append(f"*{stream}*\n\n{output_block(cell[stream])}")
    if figures := cell_images_markdown(cell):
        blocks.append(figures)
    elif cell.get("status") not in (None, "running") and not cell.get("stdout") and not cell.get("stderr"):
        blocks.append("*no output*")
    return "\n\n".join(blocks)


# Only an inline PNG is drawn: the URL goes into the page's Markdown as is, so it must not be able to end the
# image's parentheses or point the browser anywhere.
_PNG_DATA_URL = re.compile(r"data:image/png;base64,[A-Za-z0-9+/]*={0,2}")


def cell_images_markdown(cell: dict[str, Any]) -> str:
    """Every figure the cell returned, inline and in the order it made them, then why any were left out."""
    number = int(cell.get("index", 0)) + 1
    urls = [url for url in cell.get("images") or [] if isinstance(url, str) and _PNG_DATA_URL.fullmatch(url)]
    blocks = [f"![figure {i} of cell {number}]({url})" for i, url in enumerate(urls, 1)]
    if cell.get("image_notes"):
        blocks.append(f"*figures left out*\n\n{fence(chr(10).join(map(str, cell['image_notes'])))}")
    return "\n\n".join(blocks)


def strip_tool_calls(text: str) -> str:
    return _TOOL_CALL.sub("", text)


# -- math and the final answer ----------------------------------------------------------------------

# The model ends with <answer>...</answer> around its final answer and writes the result as \boxed{...} with
# no math delimiters, which the chat's KaTeX only renders between delimiters.
_ANSWER_TAG = re.compile(r"</?answer>")
_BOXED = "\\boxed{"
# Opening and closing math delimiters the chat renders (ui/chat.py's LATEX_DELIMITERS).
_MATH_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


def _closing_brace(text: str, start: int) -> int:
    """The index just past the brace that closes the one at `start`, or -1 when it is not closed (yet).
    A backslash escapes the character after it, so `\\{` and `\\}` do not count."""
    depth, index = 0, start
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return -1


def _find_unescaped(text: str, token: str, start: int) -> int:
    """Where `token` next occurs from `start` outside a backslash escape (`\$` is a dollar sign), or -1."""
    index = text.find(token, start)
    while index >= 0:
        backslashes = 0
        while index - backslashes > 0 and text[index - backslashes - 1] == "\\":
            backslashes += 1
        if backslashes % 2 == 0:
            return index
        index = text.find(token, index + 1)
    return -1


# What can start a span to leave alone (code, math), a box, or an escape, which the scan jumps between.
_NOTABLE = re.compile(r"`+|\$\$?|\\boxed\{|\\.", re.DOTALL)


def _span_end(text: str, found: re.Match) -> int:
    """Past the end of the code or math span `found` opens (shown as is), or -1 when it opens none: a fence
    runs to its closing fence (or the end, while it streams), inline code to the same run of backticks, math
    to its closing delimiter (a lone `$` is text, as KaTeX reads it)."""
    token, index = found.group(), found.start()
    if token.startswith("`"):
        if len(token) >= 3 and (index == 0 or text[index - 1] == "\n"):
            closing = text.find("\n" + token, found.end())
            return len(text) if closing < 0 else closing + 1 + len(token)
        closing = text.find(token, found.end())
        return -1 if closing < 0 else closing + len(token)
    for left, right in _MATH_DELIMITERS:
        if token == left:
            closing = _find_unescaped(text, right, found.end())
            return -1 if closing < 0 else closing + len(right)
    return -1


def math_boxes(text: str) -> str:
    """`text` with every complete `\\boxed{...}` outside math and code put between `$...$`, so the chat renders it
    as math; boxes already inside math, inside code, or not closed yet (still streaming) stay as they are."""
    if _BOXED not in text:  # most text: reasoning is re-rendered many times a second while it streams
        return text
    out, copied = [], 0
    found = _NOTABLE.search(text)
    while found:
        resume = found.end()
        if found.group() == _BOXED:
            end = _closing_brace(text, found.end() - 1)
            if end < 0:
                break
            out += [text[copied : found.start()], "$", text[found.start() : end], "$"]
            resume = copied = end
        elif (end := _span_end(text, found)) >= 0:
            resume = end
        found = _NOTABLE.search(text, resume)
    return "".join(out) + text[copied:]


def _box_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every complete `\\boxed{...}` in `text`, in order."""
    spans, index = [], text.find(_BOXED)
    while index >= 0:
        end = _closing_brace(text, index + len(_BOXED) - 1)
        if end < 0:
            break
        spans.append((index, end))
        index = text.find(_BOXED, end)
    return spans


def boxed_values(text: str) -> list[str]:
    """What every complete `\\boxed{...}` in `text` holds, in order (nested braces kept whole)."""
    return [text[start + len(_BOXED) : end - 1] for start, end in _box_spans(text)]


def _outside_boxes(text: str) -> str:
    """`text` without its complete boxes."""
    kept, copied = [], 0
    for start, end in _box_spans(text):
        kept.append(text[copied:start])
        copied = end
    return "".join(kept) + text[copied:]


def _without_answer_tags(text: str, streaming: bool) -> str:
    text = _ANSWER_TAG.sub("", text)
    if streaming:  # a tag still arriving ("<ans") is not shown for the moment it takes to complete
        cut = text.rfind("<")
        if cut >= 0 and any(tag.startswith(text[cut:]) for tag in ("<answer>", "</answer>")):
            text = text[:cut]
    return text.strip()


def answer_markdown(text: str, streaming: bool = False) -> str:
    """The final answer as the chat shows it: the <answer> tags gone, boxes rendered as math, and the boxed
    values first, as the answer line; the words around them follow unless the boxes were all there was."""
    shown = _without_answer_tags(text, streaming)
    values = boxed_values(shown)
    if not values:
        return math_boxes(shown)
    line = "**Answer:** $" + ", ".join(f"\\boxed{{{value}}}" for value in values) + "$"
    if not any(char.isalnum() for char in _outside_boxes(shown)):
        return line
    return f"{line}\n\n{math_boxes(shown)}"


@dataclass
class AssistantTurn:
    """One assistant answer as it streams in: reasoning, code cells and the answer, in arrival order."""

    segments: list[list[Any]] = field(default_factory=list)  # ["reasoning"|"answer", text] or ["cell", dict]
    finish_reason: str | None = None
    error: str | None = None
    stopped: bool = False  # the person stopped it

    def _append_text(self, kind: str, text: str) -> None:
        if not text:
            return
        if self.segments and self.segments[-1][0] == kind:
            self.segments[-1][1] += text
        else:
            self.segments.append([kind, text])

    def add_reasoning(self, text: str) -> None:
        self._append_text("reasoning", text)

    def add_content(self, text: str) -> None:
        self._append_text("answer", text)

    def update_cell(self, cell: dict[str, Any]) -> None:
        """A cell arrives once when it starts and again when it ends; the second replaces the first."""
        for segment in self.segments:
            if segment[0] == "cell" and segment[1].get("index") == cell.get("index"):
                segment[1] = {**segment[1], **cell}
                return
        self.segments.append(["cell", dict(cell)])

    @property
    def content(self) -> str:
        return "".join(text for kind, text in self.segments if kind == "answer")

    @property
    def size(self) -> int:
        """Characters the page renders for this turn (text and cells alike), what a render's cost grows with."""
        return sum(len(value) if isinstance(value, str) else sum(len(str(field)) for field in value.values()) for _, value in self.segments)

    @property
    def reasoning(self) -> str:
        return "".join(text for kind, text in self.segments if kind == "reasoning")

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> "AssistantTurn":
        """A stored assistant message (content, reasoning_content, code_cells): the order inside is lost, so
        reasoning comes first, then the cells, then the answer."""
        turn = cls()
        turn.add_reasoning(message.get("reasoning_content") or "")
        for cell in message.get("code_cells") or []:
            turn.update_cell(cell)
        turn.add_content(message.get("content") or "")
        turn.finish_reason = message.get("finish_reason")
        return turn


def _note(text: str) -> dict[str, Any]:
    """A line about the answer (stopped, cut off, failed) rather than part of it."""
    return {"role": "assistant", "content": f'<span class="{NOTE_CLASS}">{text}</span>'}


def turn_messages(turn: AssistantTurn, streaming: bool = False) -> list[dict[str, Any]]:
    """Chat messages for one assistant turn, in arrival order: reasoning (folded once it has ended), code cells,
    the answer (`answer_markdown`), then once the turn has ended the raw answer, folded, where it differs from
    what is shown, and what ended it when that was not the model (a stop, the token limit, an error)."""
    messages = []
    for position, (kind, value) in enumerate(turn.segments):
        if kind == "cell":
            messages.append({"role": "assistant", "content": cell_markdown(value)})
            continue
        text = strip_tool_calls(value).strip()
        if not text:
            continue
        live = streaming and position == len(turn.segments) - 1
        if kind == "reasoning":
            messages.append({"role": "assistant", "content": math_boxes(text), "metadata": {"title": "Reasoning", "status": "pending" if live else "done"}})
        elif shown := answer_markdown(text, streaming=live):  # not a bare tag
            messages.append({"role": "assistant", "content": shown})
    raw = strip_tool_calls(turn.content).strip()
    if not streaming and answer_markdown(raw) not in ("", raw):
        messages.append({"role": "assistant", "content": fence(raw), "metadata": {"title": "Raw answer", "status": "done"}})
    if turn.stopped:
        messages.append(_note("■ stopped"))
    if turn.finish_reason == "length":
        messages.append(_note("*(cut off: the max-tokens limit was reached)*"))
    if turn.error:
        messages.append(_note(f"⚠ {turn.error}"))
    if streaming and not messages:
        messages.append({"role": "assistant", "content": "…"})
    return messages


def download_messages(paths: list[Path]) -> list[dict[str, Any]]:
    """Chat messages offering each file the answer's code wrote for download, under the answer."""
    return [{"role": "assistant", "content": {"path": str(path)}} for path in paths]


def conversation_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stored conversation's messages as chat messages (system prompts are settings, not chat)."""
    shown = []
    for message in messages:
        if message["role"] == "user":
            shown.append({"role": "user", "content": message.get("content") or ""})
        elif message["role"] == "assistant":
            shown += turn_messages(AssistantTurn.from_message(message))
    return shown


# -- evaluations ------------------------------------------------------------------------------------


def trajectory_turn(trajectory: dict[str, Any], cells: list[dict[str, Any]]) -> AssistantTurn:
    """A stored trajectory as one assistant turn: each sampled turn's text, then the cells it called.

    `cells` are the server's code cells for the trajectory's calls (by call index), drawn as in a chat answer;
    a call with no cell (a client tool's) shows none. Calls of turn -1 were given in the prompt's final
    assistant message (a forced call) and ran first.
    """
    turn = AssistantTurn()
    cell_of_call = {cell["index"]: cell for cell in cells}
    calls = [call for call in trajectory.get("tool_calls") or [] if call.get("index") in cell_of_call]
    turns = trajectory.get("turns") or []
    for call in calls:
        if call.get("turn") == -1:
            turn.update_cell(cell_of_call[call["index"]])
    for number, sampled in enumerate(turns):
        text = sampled.get("text") or ""
        if number == len(turns) - 1 and "</reason>" in text:
            # The last turn closes its reasoning and then answers.
            reasoning, _, answer = text.partition("</reason>")
            turn.add_reasoning(reasoning.replace("<reason>", ""))
            turn.add_content(answer)
        else:
            turn.add_reasoning(text.replace("<reason>", ""))
        for call in calls:
            if call.get("turn") == number:
                turn.update_cell(cell_of_call[call["index"]])
    turn.finish_reason = trajectory.get("stop_reason")
    return turn


def sample_messages(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """An eval sample's drill-down: the prompt, the full trajectory (or the response when none was kept),
    and the grade."""
    shown = []
    for message in (sample.get("request") or {}).get("messages") or []:
        if message.get("role") == "user":
            shown.append({"role": "user", "content": message.get("content") or ""})
    if sample.get("trajectory"):
        shown += turn_messages(trajectory_turn(sample["trajectory"], sample.get("code_cells") or []))
    elif sample.get("response") is not None:
        response = sample["response"]
        shown.append({"role": "assistant", "content": answer_markdown(response) if isinstance(response, str) else fence(json.dumps(response, indent=2), "json")})
    verdict = "✓ correct" if sample.get("score", 0) >= 1 else ("✗ wrong" if sample.get("score", 0) <= 0 else f"score {sample['score']:.2f}")
    grade = fence(json.dumps(sample.get("grade") or {}, indent=2, ensure_ascii=False), "json")
    shown.append({"role": "assistant", "content": f"**Grade: {verdict}**\n\n{grade}"})
    return shown


def _format_number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def scores_table(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """A run's summary as (headers, rows): one row per benchmark, one column per metric.

    The summary maps benchmark -> metrics dict (or a bare score); the runner nests the benchmark's own metrics
    under `metrics`, which are flattened beside the rest; nested breakdowns (BFCL's categories) are left to
    the report. Metric names are unioned across benchmarks, in first-seen order, so a new metric shows up
    without a UI change.
    """
    flat = {benchmark: _flat_metrics(entry) for benchmark, entry in summary.items()}
    columns: list[str] = []
    for metrics in flat.values():
        for name in metrics:
            if name not in columns:
                columns.append(name)
    rows = [[benchmark, *(_format_number(metrics[name]) if name in metrics else "" for name in columns)] for benchmark, metrics in flat.items()]
    return ["benchmark", *columns], rows


def _flat_metrics(entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        return {"score": entry}
    own = entry.get("metrics") if isinstance(entry.get("metrics"), dict) else {}
    return {name: value for name, value in {**entry, **own}.items() if not isinstance(value, (dict, list))}


def scores_caption(summary: dict[str, Any]) -> str:
    """The score chart's label: what each bar measures, in text (the chart is the runner's scores.png, whose
    ticks say the same; a label is also what a screen reader and a browser test can read)."""
    named = [f"{name} ({entry['primary_metric']})" for name, entry in summary.items() if isinstance(entry, dict) and "primary_metric" in entry]
    return "Scores, % ± 1 s.e." + (f": {', '.join(named)}" if named else "")
