"""Recipes: a TOML file naming the stages of a run, as the paper trains in stages (8K -> 12K -> 12K tokens).

    name = "paper"
    [config]                 # GRPOConfig values for every stage
    prompts_per_step = 512
    [[stages]]
    name = "stage1-8k"
    steps = 300
    max_response_tokens = 8192
    max_turns = 10
    [[stages]]
    name = "stage3-hard"
    steps = 125
    reset_optimizer = true   # the paper resets the optimizer state here
    filter = "unsolved"      # keep only problems the current policy does not solve k/k
    filter_samples = 8

A stage may also carry a `[stages.config]` table of GRPOConfig values for itself alone. Every stage's
config is built when the recipe loads, so a wrong key or value fails before anything starts, with one
line naming it. Shipped recipes live in `rl/grpo/recipes/` and can be named without a path.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rstar.rl.grpo.config import GRPOConfig

RECIPES_DIR = Path(__file__).parent / "recipes"


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the file and the field."""


class Stage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    steps: int = Field(ge=1)
    max_response_tokens: int | None = Field(None, ge=1)
    max_turns: int | None = Field(None, ge=1)
    reset_optimizer: bool = Field(False, description="Start this stage with fresh AdamW moments and warm-up (paper stage 3).")
    filter: Literal["none", "unsolved"] = Field("none", description="'unsolved': train only on problems the policy does not solve filter_samples/filter_samples.")
    filter_samples: int = Field(8, ge=1, description="Samples per problem when filtering (the paper: 8).")
    filter_max_problems: int | None = Field(None, ge=1, description="Judge at most this many problems when filtering (a random subset; None: all).")
    config: dict[str, Any] = Field(default_factory=dict)


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    stages: list[Stage] = Field(min_length=1)

    def stage_config(self, index: int) -> GRPOConfig:
        stage = self.stages[index]
        per_stage = {key: value for key, value in (("max_response_tokens", stage.max_response_tokens), ("max_turns", stage.max_turns)) if value is not None}
        return GRPOConfig(**{**self.config, **per_stage, **stage.config})

    @property
    def max_response_tokens(self) -> int:
        """The largest response budget of any stage: with the longest prompt, the window the engine needs."""
        return max(self.stage_config(index).max_response_tokens for index in range(len(self.stages)))

    @property
    def total_steps(self) -> int:
        return sum(stage.steps for stage in self.stages)

    def truncated(self, steps: int) -> "Recipe":
        """The same recipe ending after `steps` steps in all (a trial run of a long recipe)."""
        stages, left = [], steps
        for stage in self.stages:
            if left <= 0:
                break
            stages.append(stage.model_copy(update={"steps": min(stage.steps, left)}))
            left -= stage.steps
        return self.model_copy(update={"stages": stages})

    def locate(self, step: int) -> tuple[int, int]:
        """(stage index, step within the stage) of a run's global step."""
        for index, stage in enumerate(self.stages):
            if step < stage.steps:
                return index, step
            step -= stage.steps
        raise IndexError("step beyond the recipe's last stage")


def recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        return path
    return RECIPES_DIR / f"{name_or_path}.toml"


def shipped_recipes() -> list[str]:
    return sorted(path.stem for path in RECIPES_DIR.glob("*.toml"))


def load_recipe(name_or_path: str, overrides: dict[str, Any] | None = None) -> Recipe:
    """Read and validate a recipe; `overrides` are GRPOConfig values that win over the file's (CLI flags)."""
    path = recipe_path(name_or_path)
    if not path.is_file():
        raise RecipeError(f"no recipe {name_or_path!r}: not a file, and not one of the shipped recipes ({', '.join(shipped_recipes())})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML: {exc}") from None
    return parse_recipe(data, str(path), overrides)


def parse_recipe(data: dict[str, Any], source: str, overrides: dict[str, Any] | None = None) -> Recipe:
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(f"{source}: {_first_error(exc)}") from None
    recipe.config.update(overrides or {})
    for index, stage in enumerate(recipe.stages):
        try:
            recipe.stage_config(index)
        except ValidationError as exc:
            raise RecipeError(f"{source}: stage {stage.name!r}: {_first_error(exc)}") from None
    return recipe


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"])
    message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{field}: {message}{more}" if field else f"{message}{more}"
