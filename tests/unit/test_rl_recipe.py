"""Recipes and the GRPO config: shipped recipes load, defaults are the released values, mistakes name the field."""

from __future__ import annotations

import pytest

from rstar.rl.grpo.config import GRPOConfig
from rstar.rl.grpo.recipe import RecipeError, load_recipe, parse_recipe, shipped_recipes


def test_config_defaults_are_the_released_run_script():
    config = GRPOConfig()
    assert (config.rollouts_per_prompt, config.keep_per_prompt, config.prompts_per_step) == (32, 16, 128)
    assert (config.temperature, config.top_p) == (1.0, 1.0)
    assert (config.learning_rate, config.warmup_steps, config.weight_decay, config.grad_clip) == (1e-6, 20, 0.01, 1.0)
    assert (config.clip_low, config.clip_high, config.dual_clip) == (0.2, 0.28, 3.0)
    assert (config.max_tool_response_chars, config.tool_response_truncate_side, config.max_parallel_calls) == (256, "middle", 1)
    assert (config.mini_batches_per_step, config.old_logprobs, config.downsample) == (1, "trainer", "released")


def test_every_knob_is_documented():
    undocumented = [name for name, field in GRPOConfig.model_fields.items() if not field.description]
    assert undocumented == []


def test_shipped_recipes_load_with_the_papers_stages():
    assert {"paper", "cpu"} <= set(shipped_recipes())
    paper = load_recipe("paper")
    assert [(s.steps, paper.stage_config(i).max_response_tokens) for i, s in enumerate(paper.stages)] == [(300, 8192), (85, 12288), (125, 12288)]
    assert paper.stages[2].reset_optimizer and paper.stages[2].filter == "unsolved" and paper.stages[2].filter_samples == 8
    assert paper.stage_config(0).prompts_per_step == 512 and paper.total_steps == 510
    cpu = load_recipe("cpu")
    assert cpu.stage_config(0).keep_per_prompt < cpu.stage_config(0).rollouts_per_prompt


def test_locate_maps_run_steps_to_stages():
    recipe = load_recipe("paper")
    assert recipe.locate(0) == (0, 0)
    assert recipe.locate(299) == (0, 299)
    assert recipe.locate(300) == (1, 0)
    assert recipe.locate(509) == (2, 124)
    with pytest.raises(IndexError):
        recipe.locate(510)


def test_a_truncated_recipe_keeps_its_first_stages():
    recipe = load_recipe("paper").truncated(310)
    assert [(s.name, s.steps) for s in recipe.stages] == [("stage1-8k", 300), ("stage2-12k", 10)] and recipe.total_steps == 310


def test_stage_tables_override_the_run_config():
    recipe = parse_recipe({"name": "x", "config": {"learning_rate": 1e-5}, "stages": [
        {"name": "a", "steps": 2, "max_turns": 2}, {"name": "b", "steps": 1, "config": {"learning_rate": 3e-6}}]}, "x.toml")
    assert recipe.stage_config(0).learning_rate == 1e-5 and recipe.stage_config(0).max_turns == 2
    assert recipe.stage_config(1).learning_rate == 3e-6 and recipe.stage_config(1).max_turns == 5


@pytest.mark.parametrize("data, message", [
    ({"name": "x", "stages": [{"name": "a", "steps": 1, "stepz": 3}]}, "x.toml: stages.0.stepz: unknown key"),
    ({"name": "x", "config": {"prompts_per_stepz": 3}, "stages": [{"name": "a", "steps": 1}]}, "x.toml: stage 'a': prompts_per_stepz: unknown key"),
    ({"name": "x", "config": {"keep_per_prompt": 64}, "stages": [{"name": "a", "steps": 1}]}, "keep_per_prompt (64) exceeds rollouts_per_prompt (32)"),
    ({"name": "x", "stages": [{"name": "a", "steps": 0}]}, "stages.0.steps: Input should be greater than or equal to 1"),
    ({"name": "x", "stages": []}, "stages: List should have at least 1 item"),
    ({"name": "x", "stages": [{"name": "a", "steps": 1, "config": {"downsample": "roc"}}]}, "stage 'a': downsample: Input should be 'released', 'paper' or 'none'"),
])
def test_bad_recipes_fail_with_one_line_naming_the_field(data, message):
    with pytest.raises(RecipeError) as error:
        parse_recipe(data, "x.toml")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_unknown_recipe_names_the_shipped_ones(tmp_path):
    with pytest.raises(RecipeError, match="shipped recipes .*cpu"):
        load_recipe("no-such-recipe")
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(str(broken))


def test_the_window_a_run_needs_is_its_longest_kept_prompt_and_largest_stage_budget():
    from rstar.rl.grpo.train import RecipeDoesNotFit, check_window, window_needed

    recipe = parse_recipe({"name": "two", "config": {"max_prompt_tokens": 100},
                           "stages": [{"name": "a", "steps": 1, "max_response_tokens": 300}, {"name": "b", "steps": 1, "max_response_tokens": 700}]}, "test")
    assert recipe.max_response_tokens == 700
    assert window_needed(recipe, [40, 90, 250]) == 90 + 700  # the 250-token prompt is left out, as released
    check_window(recipe, [40, 90], 790, "a window")
    with pytest.raises(RecipeDoesNotFit, match=r"recipe 'two' needs a 791-token window \(longest prompt 91 \+ max_response_tokens 700\), over a window of 790"):
        check_window(recipe, [91], 790, "a window")


def test_the_paper_recipe_does_not_fit_the_default_models_window():
    from rstar.rl.grpo.train import RecipeDoesNotFit, check_window

    with pytest.raises(RecipeDoesNotFit, match="max_response_tokens 12288"):
        check_window(load_recipe("paper"), [300], 8192, "the default model's context")
