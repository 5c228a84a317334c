"""How one sample is generated: over HTTP from any OpenAI-compatible endpoint, or in-process on an engine.

Both clients answer one chat request (`ChatClient.complete`) with a `Completion`; `generate` builds a whole
sample on top of that, so the benchmark logic (BFCL's multi-turn step loop) exists once for both:

- text benchmarks: one request; with the rStar template the server (or the in-process agent loop) runs the
  Python tool itself, up to `max_turns` assistant turns;
- function calling (BFCL): the prompt's tools are declared as client tools; the calls are the answer;
- BFCL multi-turn: the calls run in the benchmark's environment, results go back as tool messages, up to
  `max_turns` steps per user turn, then the next user turn.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import httpx

from rstar.evals.answers import answer_view
from rstar.evals.registry import RSTAR_TEMPLATE, Prompt
from rstar.server.trajectory import Trajectory


@dataclass(frozen=True)
class GenerationParams:
    model: str  # the name sent as `model` over HTTP; informational in-process
    template: str  # RSTAR_TEMPLATE: rStar prompt + built-in Python tool; NATIVE_TEMPLATE: the prompt as given
    temperature: float
    top_p: float
    max_tokens: int  # per request: the whole answer's budget, tool turns included (the paper's 30K)
    max_turns: int  # assistant turns per answer (rStar template), or model steps per user turn (BFCL multi-turn)
    seed: int | None = None
    tool_timeout: float | None = None
    # None: the served model's default (not sent; in process, `model_sampling_defaults`), else off.
    frequency_penalty: float | None = None  # OpenAI's; every OpenAI-compatible server takes it
    repetition_penalty: float | None = None  # vLLM's extension, 1 = off


@dataclass
class Completion:
    """One chat request's answer."""

    content: str  # the final answer text (what text benchmarks grade)
    tool_calls: list[dict]  # client-tool calls: {"id", "name", "arguments"} (arguments a JSON string or object)
    prompt_tokens: int
    completion_tokens: int  # sampled by the model (tool output excluded)
    turns: int  # assistant turns the answer took
    code_calls: int  # built-in tool executions inside the answer
    finish_reason: str | None
    # The answer as a trajectory in the server's Trajectory shape (turns, tool_calls, stop_reason): the agent
    # loop's own, token ids included, in process; over HTTP, built from the response, which it keeps whole.
    trajectory: dict
    error: str | None = None  # the request was refused for a reason a retry cannot fix (context too long)


class ChatClient(Protocol):
    async def complete(self, messages: list[dict], tools: list[dict] | None, params: GenerationParams) -> Completion: ...


class FatalRequestError(RuntimeError):
    """The endpoint rejects requests for a reason no retry fixes (wrong model name, bad key): stop the run."""


class Environment(Protocol):
    """A benchmark's executor of the model's calls during generation (BFCL's `MultiTurnEnv`)."""

    def execute(self, calls: list[dict]) -> list[str]: ...

    def close(self) -> None: ...


@dataclass
class Sample:
    """A generated sample, ready to grade and store."""

    response: Any  # text; the calls (BFCL single-turn); per user turn, per step, the calls (BFCL multi-turn)
    request: dict
    requests: list[dict] = field(default_factory=list)  # one trajectory per chat request the sample took
    prompt_tokens: int = 0
    completion_tokens: int = 0
    num_turns: int = 0
    num_tool_calls: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def trajectory(self) -> dict:
        """What is stored as the sample's trajectory: the one request's, or for a sample of several requests
        (BFCL multi-turn) their turns and calls in order, each request's trajectory kept under `requests`."""
        if len(self.requests) == 1:
            return self.requests[0]
        turns, calls = [], []
        for part in self.requests:
            calls += [{**call, "turn": call["turn"] + len(turns)} for call in part.get("tool_calls", [])]
            turns += part.get("turns", [])
        return {"turns": turns, "tool_calls": calls, "stop_reason": self.requests[-1].get("stop_reason") if self.requests else None, "requests": self.requests}

    def add(self, completion: Completion) -> None:
        self.requests.append(completion.trajectory)
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.completion_tokens
        self.num_turns += completion.turns
        self.num_tool_calls += completion.code_calls + len(completion.tool_calls)
        if completion.error:
            self.errors.append(completion.error)


async def generate(client: ChatClient, prompt: Prompt, params: GenerationParams, env: Environment | None = None) -> Sample:
    sample = Sample(response=None, request={"messages": prompt.messages, "tools": prompt.tools, "params": asdict(params)})
    if env is None:
        completion = await client.complete(prompt.messages, prompt.tools, params)
        sample.add(completion)
        # Text answers are read from the trajectory, so both clients' samples read (and grade) alike.
        sample.response = answer_view(completion.trajectory).answer_text if prompt.tools is None else completion.tool_calls
        return sample
    try:
        sample.response = await _multi_turn(client, prompt, params, env, sample)
    finally:
        env.close()
    return sample


async def _multi_turn(client: ChatClient, prompt: Prompt, params: GenerationParams, env: Environment, sample: Sample) -> list:
    """bfcl-eval's FC inference loop: per user turn, call the model until it answers without calls. A turn
    that reaches the step limit ends the entry (bfcl-eval's force-termination), so the turn count differs
    from the ground truth's and the grader fails it."""
    messages, tools, turns = list(prompt.messages), list(prompt.tools or []), []
    for turn, user_messages in enumerate([[], *prompt.followups]):
        messages += user_messages
        tools += prompt.tools_added.get(turn, [])
        steps: list[list[dict]] = []
        turns.append(steps)
        for _ in range(params.max_turns):
            completion = await client.complete(messages, tools, params)
            sample.add(completion)
            try:
                results = env.execute(completion.tool_calls) if completion.tool_calls else None
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                results = None  # calls that do not decode are a text answer to bfcl-eval
            if results is None:
                messages.append({"role": "assistant", "content": completion.content})
                break
            steps.append(completion.tool_calls)
            ids = [call.get("id") or f"call_{len(sample.requests)}_{i}" for i, call in enumerate(completion.tool_calls)]
            messages.append({"role": "assistant", "content": completion.content, "tool_calls": [_wire_call(i, c) for i, c in zip(ids, completion.tool_calls)]})
            messages += [{"role": "tool", "tool_call_id": i, "content": str(result)} for i, result in zip(ids, results)]
        else:
            return turns
    return turns


def _wire_call(call_id: str, call: dict) -> dict:
    arguments = call["arguments"]
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
    }


def server_template(kind: str) -> str:
    """The server's name (`chat_template` over HTTP, `choose_template`'s override in process) for a
    benchmark's template choice: NATIVE_TEMPLATE is the model's own template, never the server's default,
    which for an rStar-named model is the rStar template with its answer instruction."""
    return "rstar" if kind == RSTAR_TEMPLATE else "model"


def template_variables(kind: str) -> dict[str, Any]:
    """`chat_template_kwargs` for a benchmark's template choice. A model whose own template is rStar's (the
    embedded default) would still put the math answer instruction before an IFEval or BFCL prompt; native
    turns it off (templates without the variable ignore it)."""
    return {} if kind == RSTAR_TEMPLATE else {"math_instruction": False}


def benchmark_template(tokenizer: Any, model_name: str, kind: str):
    """The template a benchmark's prompts render with in process, as the server renders them over HTTP.
    Raises ValueError for the native choice on a model without a template of its own."""
    from rstar.server.chat_template import choose_template

    return choose_template(tokenizer, model_name, server_template(kind)).with_variables(template_variables(kind))


def listed_tools(kind: str, tools: list[dict] | None) -> list[dict]:
    """The tools the prompt lists in process: the built-in Python tool with the rStar template, else the
    benchmark's own (BFCL's functions)."""
    from rstar.server.builtin_tools import builtin_tool_schemas

    return builtin_tool_schemas() if kind == RSTAR_TEMPLATE else list(tools or [])


# ------------------------------------------------------------------------------------------------ HTTP


def chat_completions_url(endpoint: str) -> str:
    """Accepts a server root, its /v1 base URL, or the full chat-completions URL."""
    endpoint = endpoint.rstrip("/")
    if endpoint.endswith("/chat/completions"):
        return endpoint
    return endpoint + ("/chat/completions" if endpoint.endswith("/v1") else "/v1/chat/completions")


class HttpChatClient:
    """Any OpenAI-compatible endpoint. rstar's extension fields (`builtin_tools`, `max_turns`, `chat_template`,
    `chat_template_kwargs`, `tool_timeout`) go only to an rstar server (its /v1/models says `owned_by: rstar`):
    vLLM, for one, reads `chat_template` as template text, so a choice's name would become the prompt.

    Transport errors, 5xx and 429 are retried with backoff; a context-length refusal becomes a completion
    with `error` (the sample scores 0, as bfcl-eval and lm-eval count it); other 4xx stop the run.
    """

    def __init__(self, endpoint: str, api_key: str | None = None, timeout_s: float = 3600.0, retries: int = 4, backoff_s: float = 1.0):
        self.url = chat_completions_url(endpoint)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(timeout=timeout_s, headers=headers)
        self.retries = retries
        self.backoff_s = backoff_s
        self.rstar_server = True  # until `models()` says otherwise

    async def close(self) -> None:
        await self.http.aclose()

    async def models(self) -> list[dict]:
        response = await self.http.get(self.url.removesuffix("/chat/completions") + "/models")
        response.raise_for_status()
        models = response.json()["data"]
        self.rstar_server = any(model.get("owned_by") == "rstar" for model in models)
        return models

    def body(self, messages: list[dict], tools: list[dict] | None, params: GenerationParams) -> dict:
        builtin = params.template == RSTAR_TEMPLATE
        body = {
            "model": params.model,
            "messages": messages,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.frequency_penalty is not None:
            body["frequency_penalty"] = params.frequency_penalty
        if params.repetition_penalty is not None:
            body["repetition_penalty"] = params.repetition_penalty
        if tools:
            body["tools"] = tools
        if not self.rstar_server:
            return body
        body["builtin_tools"] = builtin
        # The template the benchmark was scored with, whatever the server's default for its model, as the
        # in-process path renders it: rStar's, or the model's own (never the rStar answer instruction).
        body["chat_template"] = server_template(params.template)
        if variables := template_variables(params.template):
            body["chat_template_kwargs"] = variables
        if builtin:  # without built-in tools the first turn is the answer (or ends at the client's tool calls)
            body["max_turns"] = params.max_turns
        if params.tool_timeout is not None:
            body["tool_timeout"] = params.tool_timeout
        return body

    async def complete(self, messages: list[dict], tools: list[dict] | None, params: GenerationParams) -> Completion:
        body = self.body(messages, tools, params)
        for attempt in range(self.retries + 1):
            try:
                response = await self.http.post(self.url, json=body)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
            else:
                if response.status_code < 400:
                    return parse_completion(response.json())
                if response.status_code == 400 and _error_code(response) == "context_length_exceeded":
                    refused = {"turns": [], "tool_calls": [], "stop_reason": "length", "error": response.json()}
                    return Completion("", [], 0, 0, 0, 0, "length", refused, error="context_length_exceeded")
                if response.status_code != 429 and response.status_code < 500:
                    raise FatalRequestError(f"{self.url} answered {response.status_code}: {response.text[:500]}")
                if attempt == self.retries:
                    response.raise_for_status()
            await asyncio.sleep(self.backoff_s * 2**attempt * (0.5 + random.random()))
        raise AssertionError("unreachable")


def _error_code(response: httpx.Response) -> str | None:
    try:
        return response.json()["error"].get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def parse_completion(data: dict) -> Completion:
    """Our server's extensions when present (code_cells, usage.tool_calls); plain OpenAI fields otherwise."""
    choice = data["choices"][0]
    message = choice.get("message") or {}
    cells = message.get("code_cells") or []
    calls = [
        {"id": call.get("id"), "name": call["function"]["name"], "arguments": call["function"].get("arguments", "")}
        for call in message.get("tool_calls") or []
    ]
    usage = data.get("usage") or {}
    # The final answer; a model that never left its reasoning block has its text there.
    content = message.get("content") or message.get("reasoning_content") or ""
    return Completion(
        content=content,
        tool_calls=calls,
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        # The server runs one built-in call per turn, so an answer with n cells took n + 1 turns.
        turns=len(cells) + 1,
        code_calls=len(cells),
        finish_reason=choice.get("finish_reason"),
        # The response kept whole beside its trajectory: `answer_view` reads the server's own split from it.
        trajectory={**Trajectory.from_chat_response(data).to_dict(), "response": data},
    )


# ------------------------------------------------------------------------------------------ in-process


class InProcessChatClient:
    """The server's own agent loop on an engine in this process, code run by a CodeExecutor (the sandbox).

    `loop`: the event loop the engine (and sandbox client) run on, when it is not the caller's: vLLM's
    AsyncLLM stays on the loop it started on, while grading must run on the main thread (math-verify's
    timeouts use SIGALRM), so a caller may drive the runner on one loop and the engine on another.
    """

    def __init__(self, engine: Any, executor: Any, loop: asyncio.AbstractEventLoop | None = None):
        self.engine = engine
        self.executor = executor  # a CodeExecutor: SandboxExecutor(sandbox client) outside tests
        self.loop = loop
        self._templates: dict[str, Any] = {}

    def template(self, kind: str):
        if kind not in self._templates:
            self._templates[kind] = benchmark_template(self.engine.tokenizer, self.engine.model_name, kind)
        return self._templates[kind]

    async def complete(self, messages: list[dict], tools: list[dict] | None, params: GenerationParams) -> Completion:
        work = self._complete(messages, tools, params)
        if self.loop is None or self.loop is asyncio.get_running_loop():
            return await work
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    async def _complete(self, messages: list[dict], tools: list[dict] | None, params: GenerationParams) -> Completion:
        from rstar.sandbox.tools import ToolSettings
        from rstar.server.agent_loop import LoopConfig, run_trajectory
        from rstar.server.engine import SamplingOptions
        from rstar.server.model_store import default_tool_protocol, model_sampling_defaults
        from rstar.server.schemas import resolve_penalties
        from rstar.server.tool_calls import parse_tool_calls

        builtin = params.template == RSTAR_TEMPLATE
        listed = listed_tools(params.template, tools)
        # Client tools end the answer at the first turn that calls one; the calls are read from its text.
        config = LoopConfig(
            max_turns=params.max_turns if builtin else 1,
            max_response_tokens=params.max_tokens,
            logprobs=False,
            tools=ToolSettings.of_protocol(default_tool_protocol(self.engine.model_name)),
        )
        # The penalties a run leaves to the model are what `rstar serve` would sample this model with.
        given = {"frequency_penalty": params.frequency_penalty, "repetition_penalty": params.repetition_penalty}
        sampling = SamplingOptions(
            max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p, seed=params.seed,
            **resolve_penalties(given, model_sampling_defaults(self.engine.model_name)),
        )
        template = self.template(params.template)
        # `tool_timeout` bounds each execution as the server's does; it needs a SandboxExecutor (with_timeout).
        executor = self.executor if params.tool_timeout is None else self.executor.with_timeout(params.tool_timeout)
        trajectory = await run_trajectory(self.engine, template, messages, listed, sampling, executor, config)
        text = trajectory.turns[-1].text if trajectory.turns else ""
        calls = []
        if tools:
            calls = [
                {"name": call.name, "arguments": call.raw if call.decode_error else call.arguments}
                for call in parse_tool_calls(text)
            ]
            text = text.split("<tool_call>")[0].rstrip()
        return Completion(
            content=text,
            tool_calls=calls,
            prompt_tokens=len(trajectory.prompt_ids),
            completion_tokens=trajectory.num_sampled_tokens,
            turns=len(trajectory.turns),
            code_calls=len(trajectory.tool_calls) if builtin else 0,
            finish_reason=trajectory.stop_reason,
            # Whether each turn's text begins inside the reasoning block: what `answer_view` needs to split it
            # as the server splits a response.
            trajectory={**trajectory.to_dict(), "starts_in_reasoning": template.starts_in_reasoning},
            error=None if trajectory.turns else "context_length_exceeded",
        )
