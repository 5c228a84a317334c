"""The registry entries, their paper defaults, and how loaders find (or fail to find) data."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from evals_data import REPO_ROOT, shared_data_dir

from rstar.evals import NATIVE_TEMPLATE, REGISTRY, RSTAR_TEMPLATE, DataUnavailable, Prompt, get_benchmark

PAPER = {"aime24", "aime25", "hmmt_feb_2025", "math500", "gpqa_diamond", "ifeval", "bfcl_v3"}
ALL = PAPER | {"gsm8k"}  # the word-problem yardstick small models report


def test_every_paper_benchmark_and_gsm8k_is_registered():
    assert set(REGISTRY) == ALL
    assert all(REGISTRY[name].name == name for name in ALL)
    with pytest.raises(KeyError, match="unknown benchmark 'mmlu'.*aime24"):
        get_benchmark("mmlu")


@pytest.mark.parametrize(("alias", "name"), [("hmmt25", "hmmt_feb_2025"), ("math500", "math500"), ("math-500", "math500"), ("math_500", "math500")])
def test_short_names_resolve_to_registry_entries(alias, name):
    assert get_benchmark(alias) is REGISTRY[name]


@pytest.mark.parametrize("name", ["aime24", "aime25", "hmmt_feb_2025", "math500", "gpqa_diamond"])
def test_math_and_gpqa_defaults_follow_the_paper(name):
    sampling = get_benchmark(name).sampling
    assert (sampling.temperature, sampling.samples, sampling.max_turns) == (0.6, 16, 30)
    assert sampling.template == RSTAR_TEMPLATE
    assert get_benchmark(name).primary_metric == "avg_pass_at_1"


@pytest.mark.parametrize("name", ["ifeval", "bfcl_v3"])
def test_ifeval_and_bfcl_use_their_own_prompt_greedily(name):
    sampling = get_benchmark(name).sampling
    assert (sampling.temperature, sampling.samples, sampling.template) == (0.0, 1, NATIVE_TEMPLATE)


def test_every_benchmark_loads_from_the_shared_copy_and_builds_prompts():
    counts = {name: len(REGISTRY[name].load(shared_data_dir())) for name in ALL}
    assert counts == {"aime24": 30, "aime25": 30, "hmmt_feb_2025": 30, "math500": 500, "gpqa_diamond": 198, "ifeval": 541, "bfcl_v3": 4441, "gsm8k": 1319}
    for name in ALL:
        doc = REGISTRY[name].load(shared_data_dir())[0]
        prompt = REGISTRY[name].build_prompt(doc, 0)
        assert isinstance(prompt, Prompt) and prompt.messages[-1]["role"] == "user"


def test_data_dir_may_name_the_benchmark_folder_itself():
    assert len(get_benchmark("aime24").load(shared_data_dir() / "aime24")) == 30
    assert len(get_benchmark("bfcl_v3").load(shared_data_dir() / "bfcl_v3", ("simple",))) == 400


def test_missing_local_copy_names_the_paths_it_tried(tmp_path):
    with pytest.raises(DataUnavailable, match=f"no input_data.jsonl under {tmp_path}"):
        get_benchmark("ifeval").load(tmp_path)
    with pytest.raises(DataUnavailable, match="no BFCL_v3_simple.json"):
        get_benchmark("bfcl_v3").load(tmp_path)


@pytest.mark.parametrize(
    ("name", "hf_id"),
    [("aime24", "HuggingFaceH4/aime_2024"), ("math500", "HuggingFaceH4/MATH-500"), ("gpqa_diamond", "Idavidrein/gpqa"), ("ifeval", "google/IFEval"), ("gsm8k", "openai/gsm8k")],
)
def test_unreachable_hub_error_names_the_dataset_id_and_the_override(name, hf_id):
    # A fresh interpreter in offline mode: the datasets library reads the flag at import.
    code = f"from rstar.evals import get_benchmark; get_benchmark({name!r}).load(None)"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert result.returncode != 0
    assert "DataUnavailable" in result.stderr
    assert hf_id in result.stderr and "data_dir=" in result.stderr and "--data-dir" in result.stderr


def test_ifeval_refuses_to_run_without_punkt_instead_of_downloading(monkeypatch, tmp_path):
    import nltk

    from rstar.evals import ifeval

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(ifeval.CheckersUnavailable, match="punkt_tab.*install.sh"):
        ifeval._lm_eval_ifeval.__wrapped__()
