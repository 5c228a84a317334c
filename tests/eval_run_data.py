"""A small graded eval run, written straight into a database and a run directory the way the eval runner
writes them, for the eval endpoints' and the UI's tests (no engine, no benchmark data)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy.orm import sessionmaker

from rstar.evals.report import scores_figure
from rstar.server.db import EvalRun, EvalSample

TOOL_CALL = '<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": "print(sum(d for d in range(1, 361) if 360 % d == 0))", "input": ""}}</tool_call>'

TRAJECTORY = {
    "prompt_ids": [1, 2, 3],
    "response_ids": [],
    "response_mask": [],
    "logprobs": None,
    "turns": [
        {"start": 0, "end": 10, "text": f"<reason>I will add the divisors of 360 with Python.\n{TOOL_CALL}", "finish_reason": "stop", "weight_version": 0},
        {"start": 20, "end": 30, "text": "The sum printed is 1170.</reason>\nThe answer is $\\boxed{1170}$.", "finish_reason": "stop", "weight_version": 0},
    ],
    "tool_calls": [
        {
            "turn": 0,
            "index": 0,
            "raw": TOOL_CALL,
            "name": "python_code_with_standard_io",
            "arguments": {"code": "print(sum(d for d in range(1, 361) if 360 % d == 0))", "input": ""},
            "decode_error": None,
            "response": "Tool call success\nstdout: 1170\nexecution time: 0.02s",
            "success": True,
            "stdout": "1170\n",
            "stderr": "",
            "exec_reason": None,
            "exec_status": "ok",
            "exec_duration_s": 0.021,
            "started_at": 0.0,
            "wall_s": 0.03,
        }
    ],
    "stop_reason": "stop",
    "weight_version": 0,
    "model": "SmolLM2-135M-Instruct",
}

# The runner's summary shape (`rstar.evals.runner.summarize`) for one benchmark.
SUMMARY = {"aime24": {"primary_metric": "avg_pass_at_1", "score": 0.5, "stderr": 0.5, "samples": 2, "expected_samples": 2, "docs": 2}}


def insert_eval_run(sessions: sessionmaker, run_dir: Path) -> tuple[str, list[int]]:
    """One finished run on AIME24 with a correct sample (a full trajectory with a code cell) and a wrong one
    (response only), plus the runner's report files and a plot. Returns (run id, sample ids)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "report.json").write_text(json.dumps({"summary": SUMMARY}))
    (run_dir / "report.md").write_text("# Eval report\n\n| benchmark | avg pass@1 |\n|---|---|\n| aime24 | 0.5000 |\n")
    scores_figure(SUMMARY).savefig(run_dir / "scores.png", dpi=100)  # the runner's chart (400 x 380 px)
    with sessions() as session:
        run = EvalRun(
            status="finished",
            model="SmolLM2-135M-Instruct",
            suite=["aime24"],
            config={"aime24": {"temperature": 0.6, "samples": 1}},
            summary=SUMMARY,
            run_dir=str(run_dir),
            finished_at=datetime.now(timezone.utc),
        )
        run.samples = [
            EvalSample(
                benchmark="aime24",
                doc_id="2024-I-1",
                sample_index=0,
                score=1.0,
                grade={"extracted": "1170", "target": "1170"},
                request={"messages": [{"role": "user", "content": "What is the sum of all positive divisors of 360?"}]},
                response="The answer is $\\boxed{1170}$.",
                trajectory=TRAJECTORY,
                num_turns=2,
                num_tool_calls=1,
                prompt_tokens=40,
                completion_tokens=60,
            ),
            EvalSample(
                benchmark="aime24",
                doc_id="2024-I-2",
                sample_index=0,
                score=0.0,
                grade={"extracted": "12", "target": "16"},
                request={"messages": [{"role": "user", "content": "Find the remainder when 2^100 is divided by 17."}]},
                response="The answer is 12.",
                num_turns=1,
                prompt_tokens=30,
                completion_tokens=8,
            ),
        ]
        session.add(run)
        session.commit()
        return run.id, [sample.id for sample in run.samples]
