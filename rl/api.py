"""RL from a running server: `POST /v1/rl/runs` trains on the very engine and sandbox that serve the API.

`rstar serve` mounts these routes (`mount_rl`) next to the OpenAI API, as it mounts the UI: the server package
never imports `rl/`. A run is a task on the server's event loop: rollouts go through the serving engine, the
trainer works in a thread, and after each update the engine reloads the new weights in place, so the API
keeps answering throughout and `system_fingerprint` says which weight version answered. One run at a time
per server (a second is a 409). Data is read from a file on the server, inside the allowed roots only.

    POST /v1/rl/runs               {"recipe": "cpu", "data": "/path/rl_train.jsonl", "run_id"?: ..., "config"?: {...}}
    GET  /v1/rl/runs               runs, newest first
    GET  /v1/rl/runs/{id}          one run with its per-step metrics and checkpoints
    POST /v1/rl/runs/{id}/cancel   stop after the current step
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from rstar.config import Settings
from rstar.rl.data import DataError, load_problems
from rstar.rl.recipe import RecipeError, load_recipe
from rstar.rl.rollout import RolloutEnv
from rstar.rl.runs import RunConflict, RunStore, UnknownRun, new_run_id
from rstar.rl.train import RunSpec, train_grpo
from rstar.server.db import app_database
from rstar.server.errors import APIError

log = logging.getLogger("rstar.rl")


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(description="A shipped recipe name (`rstar rl recipes`) or a TOML file on the server.")
    data: str = Field(description="A JSONL file of problems with answers on the server, inside the allowed data roots.")
    run_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$", description="An unfinished run with this id resumes.")
    config: dict[str, Any] = Field(default_factory=dict, description="GRPOConfig values that override the recipe's for every stage.")


def allowed_roots(settings: Settings) -> list[Path]:
    """Where a client may point the server at files: its data dir and the directory it was started in."""
    return [settings.data_dir.resolve(), Path.cwd().resolve()]


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def mount_rl(app: FastAPI, settings: Settings, dependencies: list) -> None:
    router = APIRouter(prefix="/v1/rl", dependencies=dependencies)
    runs = Depends(_run_store)
    state: dict[str, asyncio.Task | None] = {"task": None}

    @router.post("/runs", status_code=202)
    async def start_run(body: RunRequest, request: Request, store: RunStore = runs) -> dict:
        running = state["task"]
        if running is not None and not running.done():
            raise APIError(409, f"run {running.get_name()} is in progress on this server; cancel it first (POST /v1/rl/runs/{running.get_name()}/cancel)", "run_id", "run_in_progress")
        for name, value in (("recipe", body.recipe), ("data", body.data)):
            path = Path(value).expanduser().resolve()
            if ("/" in value or path.exists()) and not _inside(path, allowed_roots(settings)):
                raise APIError(400, f"{name} {value!r} is outside the directories this server reads from ({', '.join(map(str, allowed_roots(settings)))})", name)
        try:
            recipe = load_recipe(body.recipe, body.config)
            problems = await asyncio.to_thread(load_problems, body.data)
        except RecipeError as exc:
            raise APIError(400, str(exc), "recipe") from None
        except DataError as exc:
            raise APIError(400, str(exc), "data") from None
        serving = request.app.state.serving
        run_id = body.run_id or new_run_id("grpo")
        spec = RunSpec(run_id, settings.data_dir / "rl_runs" / run_id, recipe, Path(serving.engine.model_path), body.data, serving.engine.dtype)
        env = RolloutEnv(serving.engine, serving.template, serving.sandbox)
        try:
            await asyncio.to_thread(store.begin, run_id, "grpo", str(spec.model_dir), recipe.model_dump(), body.data, str(spec.run_dir), recipe.total_steps)
        except RunConflict as exc:
            raise APIError(409, str(exc), "run_id", "run_in_progress") from None
        state["task"] = asyncio.create_task(_execute(env, spec, problems, store), name=run_id)
        return await asyncio.to_thread(store.get, run_id, False)

    @router.get("/runs")
    def list_runs(store: RunStore = runs, limit: int = 50) -> dict:
        return {"object": "list", "data": store.list(limit)}

    @router.get("/runs/{run_id}")
    def get_run(run_id: str, store: RunStore = runs) -> dict:
        return _known(store.get, run_id)

    @router.post("/runs/{run_id}/cancel")
    def cancel_run(run_id: str, store: RunStore = runs) -> dict:
        return _known(store.request_cancel, run_id)

    app.include_router(router)

    # Stop a run before the app's own shutdown closes the engine under it; it stays resumable.
    serving_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async with serving_lifespan(app) as lifespan_state:
            try:
                yield lifespan_state
            finally:
                task = state["task"]
                if task is not None and not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)

    app.router.lifespan_context = lifespan


def _run_store(request: Request) -> RunStore:
    """The RL run tables through the app's one database engine (opened by the API's lifespan)."""
    return RunStore(app_database(request))


def _known(action, run_id: str) -> dict:
    try:
        return action(run_id)
    except UnknownRun:
        raise APIError(404, f"No RL run with id {run_id!r}.", "run_id", "run_not_found") from None


async def _execute(env: RolloutEnv, spec: RunSpec, problems, store: RunStore) -> None:
    try:
        status = await train_grpo(env, spec, problems, store)
        log.info("rl run %s %s", spec.run_id, status)
    except asyncio.CancelledError:
        raise
    except Exception:  # recorded on the run by train_grpo; the server goes on serving
        log.exception("rl run %s failed", spec.run_id)
