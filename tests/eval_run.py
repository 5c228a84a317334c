"""A small eval run written by the eval runner itself, for the tests of what reads runs back: the eval
endpoints, the UI's drill-down and the browser's Evaluations tab.

Everything but the model is real: two AIME 2024 problems from the offline copy, the runner's `execute` with
the in-process client (the server's agent loop, the rStar template, a real sandbox running the model's code),
the grader, the run store and the runner's reports. The model is the scripted engine: it answers the first
problem right after running one code cell, and the second wrong without a tool, so a reader sees a correct
sample with a trajectory and a wrong one, and a summary of 0.5.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy.orm import sessionmaker

from rstar.evals import get_benchmark
from rstar.evals.client import InProcessChatClient
from rstar.evals.report import write_run_reports
from rstar.evals.runner import RunStore, execute, plan
from rstar.sandbox.clients import connect
from rstar.server import routes_evals
from rstar.server.builtin_tools import SandboxExecutor
from rstar.server.errors import install_error_handlers
from tests.scripted_engine import ScriptedEngine
from tests.unit.evals_data import shared_data_dir


@dataclass(frozen=True)
class WrittenRun:
    run_id: str
    run_dir: Path
    right_doc: dict  # answered right, after one code cell
    wrong_doc: dict  # answered wrong, no tool call
    code: str  # the cell the model ran for the right answer


def scripted_replies(right: dict, wrong: dict) -> tuple[str, list[str]]:
    """(the code cell, the model's turns in order): a tool call and an answer for `right`, then one wrong
    answer for `wrong`."""
    code = f"print({right['answer']})"
    call = json.dumps({"name": "python_code_with_standard_io", "arguments": {"code": code, "input": ""}})
    return code, [
        f"I will check the value with Python.\n<tool_call>\n{call}\n</tool_call>",
        f"The program printed {right['answer']}.</reason>\n<answer>\\boxed{{{right['answer']}}}</answer>",
        f"A guess.</reason>\n<answer>\\boxed{{{int(wrong['answer']) + 1}}}</answer>",
    ]


def write_eval_run(sessions: sessionmaker, runs_root: Path, tokenizer) -> WrittenRun:
    """Run the runner on the database behind `sessions`, write its reports under `runs_root`, and say what
    it wrote. Synchronous: it runs its own event loop (call it from a thread where one is running already)."""
    right, wrong = get_benchmark("aime24").load(shared_data_dir())[:2]
    code, replies = scripted_replies(right, wrong)
    store = RunStore(sessions)
    # The paper's sampling, but one sample per problem and a budget the scripted engine's window holds.
    config = {"benchmarks": plan(["aime24"], {"samples": 1, "max_tokens": 512}), "limit": None, "data_dir": None, "seed": 0}
    run = store.create(None, "scripted", "", list(config["benchmarks"]), config)

    async def run_it() -> None:
        async with connect() as sandbox:
            client = InProcessChatClient(ScriptedEngine(tokenizer, replies), SandboxExecutor(sandbox))
            # One worker: the scripted turns are served in order, the right problem's first.
            outcome = await execute(store, run, client, concurrency=1, docs={"aime24": [right, wrong]})
        assert (outcome.status, outcome.generated, outcome.failed) == ("finished", 2, 0), outcome

    asyncio.run(run_it())
    run_dir = write_run_reports(store, run.id, runs_root)
    return WrittenRun(run.id, run_dir, right, wrong, code)


def eval_routes_app(sessions: sessionmaker) -> FastAPI:
    """The /v1/evals routes on a bare app over `sessions`, with the API's error handlers, as the API mounts
    them (its lifespan puts its database in `app.state.database`)."""
    app = FastAPI()
    install_error_handlers(app)
    app.state.database = sessions
    app.include_router(routes_evals.router)
    return app
