"""Renders of rStar2-Agent's released chat template, shipped with the tests so the checks against them run on
any clone: an independent reference for the rStar template, the tool-turn bridge and /tokenize.

`reference/rstar_template_renders.json` says where they come from (its `source`: microsoft/rStar at the commit
below, rendered with jinja2 as transformers renders chat templates).
"""

from __future__ import annotations

import json
from pathlib import Path

PATH = Path(__file__).parent / "reference" / "rstar_template_renders.json"
SOURCE_COMMIT = "ecbfb943e202b4ed017d2d35f2029917b27db4cd"


def released_renders() -> dict[str, dict]:
    """The cases by name: messages, tools, add_generation_prompt and the released template's `rendered` text."""
    data = json.loads(PATH.read_text(encoding="utf-8"))
    assert SOURCE_COMMIT in data["source"], data["source"]
    return {case["name"]: case for case in data["cases"]}
