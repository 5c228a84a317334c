"""Does a run's token budget fit the model's context window? Checked before a run starts, on both paths.

A benchmark's budget is its `max_tokens` (the whole answer, tool output included) plus its longest prompt:
the prompt of its (selected) doc whose first request is longest in characters, counted in tokens as the
model sees it (template, system prompt and listed tools included). The run fits when every benchmark's
budget is at most the window. Later requests of a BFCL multi-turn doc grow past its first prompt; one that
no longer fits is refused by the server and stored as a refused sample (scored 0, counted in the report).

- In process, prompts are counted with the model's tokenizer and the run's templates before the engine
  starts, and the engine starts with a window of at least the largest budget; the run is refused when that
  exceeds what the model supports (its `max_position_embeddings`).
- Over HTTP, the window is the `max_model_len` the server reports in `/v1/models` (vLLM and rstar do), and
  each benchmark's longest prompt is counted by the server itself: a one-token request, whose
  `usage.prompt_tokens` is the answer. A server that reports no window is not checked (said on the console).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Callable

from rstar.evals.registry import Doc, Prompt


@dataclass(frozen=True)
class Budget:
    benchmark: str
    max_tokens: int
    prompt_tokens: int | None  # None: the longest prompt alone did not fit (the server refused it)
    # Whether the template opens every answer inside a reasoning block (runner.open_reasoning_budgets).
    opens_reasoning: bool = False

    @property
    def needed(self) -> int | None:
        return None if self.prompt_tokens is None else self.max_tokens + self.prompt_tokens


def longest_prompt(docs: list[Doc], build_prompt: Callable[[Doc, int], Prompt]) -> Prompt:
    """The first-request prompt with the most characters (messages and tools), the one a budget is sized on."""
    prompts = [build_prompt(doc, 0) for doc in docs]
    return max(prompts, key=lambda p: len(json.dumps([p.messages, p.tools], ensure_ascii=False)))


def budget_problems(budgets: list[Budget], window: int) -> list[str]:
    """One phrase per benchmark whose budget does not fit `window`, naming the numbers."""
    problems = []
    for budget in budgets:
        if budget.needed is None:
            problems.append(f"{budget.benchmark} (its longest prompt alone is over the window)")
        elif budget.needed > window:
            problems.append(
                f"{budget.benchmark} (max_tokens {budget.max_tokens} + longest prompt {budget.prompt_tokens} = {budget.needed})"
            )
    return problems


def largest_room(budgets: list[Budget], window: int) -> int | None:
    """The largest --max-tokens that fits every benchmark in `window`, or None when some prompt alone does not fit."""
    if any(b.prompt_tokens is None for b in budgets):
        return None
    return window - max(b.prompt_tokens for b in budgets)


def refusal(budgets: list[Budget], window: int, window_source: str, window_fix: str) -> str | None:
    """The one-line reason a run cannot start, or None when it fits."""
    problems = budget_problems(budgets, window)
    if not problems:
        return None
    room = largest_room(budgets, window)
    fix = f"pass --max-tokens {room} or less" if room and room > 0 else "shorten the prompts"
    return f"the token budget does not fit {window_source} of {window} tokens: {'; '.join(problems)}. To fix: {fix}, or {window_fix}"


def model_window_limit(model_path: str) -> int | None:
    """The longest context the model supports (its config's max_position_embeddings), None if it does not say."""
    from transformers import AutoConfig

    config: Any = AutoConfig.from_pretrained(model_path)
    config = getattr(config, "text_config", None) or config
    return getattr(config, "max_position_embeddings", None)


async def measure_with_server(client: Any, benchmarks: dict[str, dict], prompts: dict[str, Prompt], model: str) -> list[Budget]:
    """Each benchmark's longest prompt counted by the server: a one-token request with the run's template,
    whose `usage.prompt_tokens` is the count (a refusal for length: the prompt alone is over the window).
    The template opened a reasoning block when that one token came back as `reasoning_content` (rstar
    splits reasoning by the template's opening; a server that does not never reports one)."""
    from rstar.evals.client import GenerationParams

    budgets = []
    for name, sampling in benchmarks.items():
        params = GenerationParams(model=model, template=sampling["template"], temperature=0.0, top_p=1.0, max_tokens=1, max_turns=1)
        completion = await client.complete(prompts[name].messages, prompts[name].tools, params)
        message = ((completion.trajectory.get("response") or {}).get("choices") or [{}])[0].get("message") or {}
        opens = bool(message.get("reasoning_content")) and not message.get("content")
        budgets.append(Budget(name, sampling["max_tokens"], None if completion.error else completion.prompt_tokens, opens))
    return budgets


def measure_with_tokenizer(tokenizer: Any, model_name: str, benchmarks: dict[str, dict], prompts: dict[str, Prompt]) -> list[Budget]:
    """Each benchmark's longest prompt rendered and counted as the in-process client will send it.
    A model without a template of its own raises ValueError for the native template."""
    from rstar.evals.client import benchmark_template, listed_tools

    budgets = []
    for name, sampling in benchmarks.items():
        template = benchmark_template(tokenizer, model_name, sampling["template"])
        prompt = prompts[name]
        count = len(template.encode(prompt.messages, listed_tools(sampling["template"], prompt.tools)))
        budgets.append(Budget(name, sampling["max_tokens"], count, template.starts_in_reasoning))
    return budgets


def with_reasoning_budgets(config: dict, budgets: list[Budget]) -> list[Budget]:
    """Put each benchmark's reasoning budget in force where its template opens a reasoning block (in
    `config["benchmarks"]`, before the run is stored), and return the budgets to check against the window."""
    from rstar.evals.runner import open_reasoning_budgets

    config["benchmarks"] = open_reasoning_budgets(config["benchmarks"], {b.benchmark: b.opens_reasoning for b in budgets})
    return [replace(b, max_tokens=config["benchmarks"][b.benchmark]["max_tokens"]) for b in budgets]
