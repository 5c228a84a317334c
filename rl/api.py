"""RL from a running server: `POST /v1/rl/runs` trains on the very engine and sandbox that serve the API.

`rstar serve --enable-rl` mounts this router next to the OpenAI API (`rstar/app.py`), as it mounts the UI: the
server package never imports `rl/`. They take the admin key (the API key where there is none), since a run
retrains the model every client is served. A run is a task on the server's event loop: rollouts go through
the serving engine, taking admission slots like API requests (at most a share of them, behind waiting API
requests), the trainer works in a thread, and after each update the engine reloads the new weights in place,
so the API keeps answering throughout and `system_fingerprint` says which weight version answered. One run at
a time per server (a second is a 409). Data and recipe files are regular files under the data dir; a client
may override only the knobs in OVERRIDE_BOUNDS, within their ranges.

    POST /v1/rl/runs               {"recipe": "cpu", "data": "/path/rl_train.jsonl", "run_id"?: ..., "config"?: {...}}
    GET  /v1/rl/runs               runs, newest first
    GET  /v1/rl/runs/{id}          one run with its per-step metrics and checkpoints
    POST /v1/rl/runs/{id}/cancel   stop after the current step
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from rstar.config import Settings
from rstar.rl.data import DataError, load_problems
from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.distributed import check_world_size
from rstar.rl.grpo.recipe import Recipe, RecipeError, load_recipe, shipped_recipes
from rstar.rl.grpo.rollout import RolloutEnv
from rstar.rl.grpo.train import RecipeDoesNotFit, RunSpec, check_window, prompt_lengths, train_grpo
from rstar.rl.runs import RunConflict, RunStore, UnknownRun, new_run_id
from rstar.server.db import app_database
from rstar.server.errors import APIError
from rstar.server.limits import AdmittedGenerations
from rstar.server.serving_base import Serving

log = logging.getLogger("rstar.rl")


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(description="A shipped recipe name (`rstar rl recipes`) or a TOML file on the server.")
    data: str = Field(description="A JSONL file of problems with answers on the server, inside the allowed data roots.")
    # Starts with a letter or digit: `.` and `..` would name the runs directory or its parent.
    run_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="An unfinished run with this id resumes.")
    config: dict[str, Any] = Field(default_factory=dict, description="GRPOConfig values that override the recipe's for every stage (OVERRIDE_BOUNDS).")


# The knobs a client may override, each within a range: enough to size a run to the deployment and tune its
# learning rate, not enough to wreck the served weights in a step or run the server out of memory. Anything
# else is the operator's, in a recipe file under the data dir.
OVERRIDE_BOUNDS: dict[str, tuple[float, float]] = {
    "learning_rate": (0.0, 1e-5),
    "warmup_steps": (0, 1000),
    "prompts_per_step": (1, 512),
    "rollouts_per_prompt": (1, 64),
    "keep_per_prompt": (1, 64),
    "max_response_tokens": (1, 32768),
    "max_turns": (1, 30),
    "temperature": (0.1, 2.0),
    "top_p": (0.1, 1.0),
    "tool_timeout_s": (0.5, 30.0),
    "seed": (0, 2**31 - 1),
    "save_every": (1, 1000),
    "keep_checkpoints": (1, 10),
    "trainer_ranks": (1, 64),  # and no more than the server's cores or GPUs (requested_recipe)
    "lora_rank": (0, 256),  # and no more than the max_lora_rank the server's engine started with (requested_recipe)
}
MAX_DATA_BYTES = 512 * 1024 * 1024


def bounded_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """The request's overrides, or APIError 400 naming the first knob that is not overridable or out of range."""
    for knob, value in config.items():
        param = f"config.{knob}"
        if knob not in GRPOConfig.model_fields:
            raise APIError(400, f"{knob}: unknown key (not a GRPOConfig knob)", param)
        if knob not in OVERRIDE_BOUNDS:
            raise APIError(400, f"{knob} cannot be set over the API (a recipe file under the data dir can); overridable: {', '.join(OVERRIDE_BOUNDS)}", param)
        low, high = OVERRIDE_BOUNDS[knob]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise APIError(400, f"{knob} must be a number from {low:g} to {high:g}, got {value!r}", param)
    return config


def data_file(value: str, param: str, settings: Settings) -> Path:
    """A file a client names: a regular file under the data dir (a relative path is taken from there), at most
    MAX_DATA_BYTES; APIError 400 naming `param` otherwise."""
    root = settings.data_dir.resolve()
    path = (root / Path(value).expanduser()).resolve()
    if not path.is_relative_to(root):
        raise APIError(400, f"{param} {value!r} is outside the directories this server reads from (its data dir, {root})", param)
    if not path.is_file():
        raise APIError(400, f"{param} {value!r} is not a regular file under {root}", param)
    if path.stat().st_size > MAX_DATA_BYTES:
        raise APIError(400, f"{param} {value!r} is over {MAX_DATA_BYTES} bytes", param)
    return path


def requested_recipe(body: RunRequest, settings: Settings) -> Recipe:
    source = body.recipe if body.recipe in shipped_recipes() else str(data_file(body.recipe, "recipe", settings))
    try:
        recipe = load_recipe(source, bounded_overrides(body.config))
    except RecipeError as exc:
        raise APIError(400, str(exc), "config" if body.config else "recipe") from None
    try:
        check_world_size(recipe.stage_config(0).trainer_ranks)
    except ValueError as exc:
        raise APIError(400, str(exc), "config.trainer_ranks") from None
    lora_rank, served = max(recipe.stage_config(i).lora_rank for i in range(len(recipe.stages))), settings.engine.max_lora_rank
    if lora_rank > served:
        raise APIError(400, f"lora_rank {lora_rank}: this server's engine serves LoRA adapters up to rank {served} (0: none); start the server with "
                            f"RSTAR_ENGINE__MAX_LORA_RANK={lora_rank} or more, or train without lora_rank", "config.lora_rank")
    return recipe


class RlRuns:
    """The one RL run a server trains at a time (`app.state.rl_runs`)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.task: asyncio.Task | None = None
        # Held from the one-run check until the run's task exists: two POSTs at once cannot both pass the check.
        self.starting = asyncio.Lock()

    async def start(self, body: RunRequest, serving: Serving, store: RunStore) -> str:
        """Start the run `body` asks for on the serving engine; its id. APIError 409 while another runs."""
        settings = self.settings
        async with self.starting:
            running = self.task
            if running is not None and not running.done():
                raise APIError(409, f"run {running.get_name()} is in progress on this server; cancel it first (POST /v1/rl/runs/{running.get_name()}/cancel)", "run_id", "run_in_progress")
            recipe = requested_recipe(body, settings)
            data = data_file(body.data, "data", settings)
            try:
                problems = await asyncio.to_thread(load_problems, str(data))
            except DataError as exc:
                raise APIError(400, str(exc), "data") from None
            lengths = await asyncio.to_thread(prompt_lengths, serving.template, problems)
            try:
                check_window(recipe, lengths, serving.engine.max_model_len, "this server's context window")
            except RecipeDoesNotFit as exc:
                raise APIError(400, str(exc), "config" if body.config else "recipe") from None
            run_id = body.run_id or new_run_id("grpo")
            spec = RunSpec(run_id, settings.data_dir / "rl_runs" / run_id, recipe, Path(serving.engine.model_path), str(data), serving.engine.dtype)
            share = max(1, int(serving.admission.max_running * settings.api.rl_share))
            engine = AdmittedGenerations(serving.engine, serving.admission, share)
            env = RolloutEnv(engine, serving.template, serving.sandbox)
            try:
                await asyncio.to_thread(store.begin, run_id, "grpo", str(spec.model_dir), recipe.model_dump(), str(data), str(spec.run_dir), recipe.total_steps)
            except RunConflict as exc:
                raise APIError(409, str(exc), "run_id", "run_in_progress") from None
            self.task = asyncio.create_task(_execute(env, spec, problems, store, lengths), name=run_id)
        return run_id

    async def stop(self) -> None:
        """Stop the run before the app's own shutdown closes the engine under it; it stays resumable."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


router = APIRouter(prefix="/v1/rl")


def _run_store(request: Request) -> RunStore:
    """The RL run tables through the app's one database engine (opened by the API's lifespan)."""
    return RunStore(app_database(request))


runs = Depends(_run_store)


def _known(action, run_id: str) -> dict:
    try:
        return action(run_id)
    except UnknownRun:
        raise APIError(404, f"No RL run with id {run_id!r}.", "run_id", "run_not_found") from None


@router.post("/runs", status_code=202)
async def start_run(body: RunRequest, request: Request, store: RunStore = runs) -> dict:
    run_id = await request.app.state.rl_runs.start(body, request.app.state.serving, store)
    return await asyncio.to_thread(store.get, run_id, False)


@router.get("/runs")
def list_runs(store: RunStore = runs, limit: int = Query(50, ge=1, le=200)) -> dict:
    return {"object": "list", "data": store.list(limit)}


@router.get("/runs/{run_id}")
def get_run(run_id: str, store: RunStore = runs) -> dict:
    return _known(store.get, run_id)


@router.post("/runs/{run_id}/cancel")
def cancel_run(run_id: str, store: RunStore = runs) -> dict:
    return _known(store.request_cancel, run_id)


async def _execute(env: RolloutEnv, spec: RunSpec, problems, store: RunStore, lengths: list[int]) -> None:
    try:
        status = await train_grpo(env, spec, problems, store, prompt_tokens=lengths)
        log.info("rl run %s %s", spec.run_id, status)
    except asyncio.CancelledError:
        raise
    except Exception:  # recorded on the run by train_grpo; the server goes on serving
        log.exception("rl run %s failed", spec.run_id)
