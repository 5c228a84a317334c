"""Tool-use SFT data made by the product itself: problems that need computation, a correct program for each,
the program's real output from our sandbox, and a final answer in rStar2-Agent's format.

The embedded default model never calls its Python tool; a small supervised fine-tune on these conversations
teaches it to. Each conversation is what the served model should produce, in the server's own terms:

    user       the problem
    assistant  "<reason>" + a short plan, one `python_code_with_standard_io` call
    tool       the sandbox's result, rendered by `render_exec_result` exactly as the server shows it
    assistant  "<reason>" + a sentence reading the output + "</reason>\\n<answer>\\n... \\boxed{N} ...\\n</answer>"

Every assistant turn opens with "<reason>" because the rStar template's generation prompt forces it there.
In about `BUG_RATE` of training conversations the first program has a realistic bug (a misspelled name, a
missing import, a string + number TypeError); the sandbox reports the failure and the assistant fixes it
in a second call. This teaches recovery and gives RL's tool-error filter something to see.

Problems come from the catalogue (`sft_catalogue.py`): families of phrasings, each tied to a computation,
with the last phrasings of every family held out. This module plans examples from it, injects the bugs,
runs the programs in the sandbox and writes the files.

Reproducibility: everything random is drawn from local `random.Random` streams named by (stream, split,
seed). The same seed gives identical files except for the `execution time: X.XXs` text of tool results,
the only field that depends on the machine; the manifest's sha256 of each file is computed with those
timings normalized, so it is the same for the same seed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from rstar.rl.sft.catalogue import FAMILIES, heldout_phrasing_ids, phrasing_by_id
from rstar.rl.sft.gsm8k import REFUSALS, NotConvertible, solution_program
from rstar.sandbox.clients import LocalClient
from rstar.sandbox.settings import SandboxSettings
from rstar.sandbox.tools import PYTHON_TOOL
from rstar.server.builtin_tools import CodeExecutor, SandboxExecutor
from rstar.server.tool_results import render_exec_result

BUG_RATE = 0.1  # share of training conversations whose first program fails and is fixed
# Conversations built at once: enough to keep a sandbox pool's workers busy, far below its queue limit.
CONCURRENT_CONVERSATIONS = 8

SPLITS = ("train", "heldout")


# --- bugs: realistic first attempts that fail, and what the assistant says when fixing them --------------


@dataclass(frozen=True)
class Bug:
    code: str  # the failing program
    fix: str  # the assistant's sentence after seeing the failure


def misspelled_name(code: str, rng: random.Random) -> Bug | None:
    """A NameError: a variable of the final print, misspelled by dropping one inner letter."""
    *body, last = code.split("\n")
    assigned = {name for line in body if (target := re.match(r"([a-z_][\w, ]*) = ", line))
                for name in target.group(1).split(", ")}
    used = [name for name in re.findall(r"[A-Za-z_]\w*", last) if name in assigned and len(name) >= 4]
    if not used:
        return None
    name = rng.choice(sorted(set(used)))
    cut = rng.randint(1, len(name) - 2)
    typo = name[:cut] + name[cut + 1 :]
    buggy_last = re.sub(rf"\b{name}\b", typo, last)
    return Bug("\n".join([*body, buggy_last]),
               f"The program failed with a NameError: I wrote `{typo}` instead of `{name}`. "
               "I will fix the name and run it again.")


def missing_import(code: str, rng: random.Random) -> Bug | None:
    """A NameError: the program's import line left out."""
    first, _, rest = code.partition("\n")
    if not first.startswith(("import ", "from ")):
        return None
    return Bug(rest, f"The program failed because I forgot `{first}`. I will add the import and run it again.")


def string_concatenation(code: str, rng: random.Random) -> Bug | None:
    """A TypeError: the final print glues a label onto the number with +."""
    *body, last = code.split("\n")
    match = re.fullmatch(r"print\((.*)\)", last)
    if not match:
        return None
    label = rng.choice(["Answer: ", "Result: ", "The answer is "])
    return Bug("\n".join([*body, f'print("{label}" + {match.group(1)})']),
               "Adding a string to a number raised a TypeError. I will print the number on its own.")


BUG_MAKERS = (misspelled_name, missing_import, string_concatenation)


# --- planning examples (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedCall:
    reason: str  # the assistant's sentence before the call
    code: str
    fails: bool  # the sandbox must report a failure (a planted bug); else it must print the answer


@dataclass(frozen=True)
class Example:
    id: str
    family: str
    phrasing: str  # "family/index"
    split: str  # "train" | "heldout"
    problem: str
    answer: str  # an integer, as the program prints it
    messages: list[dict] | None = None  # filled by build_conversations
    # What build_conversations will do, drawn with the problem so that step needs no randomness:
    calls: tuple[PlannedCall, ...] = ()
    reading: str = ""  # the final turn's sentence; `{output}` is the program's stdout
    conclusion: str = ""  # inside <answer>; `{answer}` is the program's stdout

    def row(self) -> dict:
        """The JSON row of sft_train.jsonl and heldout.jsonl."""
        return {"id": self.id, "family": self.family, "phrasing": self.phrasing, "split": self.split,
                "problem": self.problem, "answer": self.answer, "messages": self.messages}

    def rl_row(self) -> dict:
        """The JSON row of rl_train.jsonl: a problem and its answer, no conversation."""
        return {"problem": self.problem, "answer": self.answer, "family": self.family, "phrasing": self.phrasing,
                "id": self.id}


READINGS = (
    "The program printed {output}.",
    "Python returned {output}.",
    "The output is {output}.",
    "The code ran and printed {output}.",
)


def plan_example(rng: random.Random, example_id: str, phrasing_id: str, split: str) -> Example:
    """Draw the numbers, the program, the sentences and (in training, at BUG_RATE) a failing first attempt."""
    phrasing = phrasing_by_id(phrasing_id)
    computation = phrasing.computation
    fields = computation.sample(rng)
    code = rng.choice(computation.programs).format(**fields)
    plan = rng.choice(computation.plans).format(**fields)
    calls = (PlannedCall(plan, code, fails=False),)
    if split == "train" and rng.random() < BUG_RATE:
        bugs = [bug for maker in BUG_MAKERS if (bug := maker(code, rng)) is not None]
        bug = rng.choice(bugs)  # string_concatenation applies to every program
        calls = (PlannedCall(plan, bug.code, fails=True), PlannedCall(bug.fix, code, fails=False))
    return Example(
        id=example_id,
        family=phrasing_id.split("/")[0],
        phrasing=phrasing_id,
        split=split,
        problem=phrasing.text.format(**fields),
        answer=str(computation.answer(fields)),
        calls=calls,
        reading=rng.choice(READINGS),
        conclusion=phrasing.conclusion or computation.conclusion,
    )


def generate_problems(seed: int, count: int, split: str, *, stream: str = "sft",
                      avoid: Collection[str] = ()) -> list[Example]:
    """`count` problems of `split`'s phrasings, families in turn, with their planned programs; no sandbox.

    stream: names an independent random stream ("sft" for conversations, "rl" for RL problems), so one seed
    gives different numbers for each. avoid: problem texts not to produce (e.g. another file's), and no
    problem repeats within the result.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    # The stream name is part of every seed: it stays as first written, so a seed draws the problems it always drew.
    rng = random.Random(f"rstar.rl.sft_data/{stream}/{split}/{seed}")
    seen = set(avoid)
    examples = []
    while len(examples) < count:
        family = FAMILIES[len(examples) % len(FAMILIES)]
        example_id = f"{stream}-{split}-{len(examples):05d}"
        example = plan_example(rng, example_id, rng.choice(family.phrasing_ids(split)), split)
        if example.problem not in seen:
            seen.add(example.problem)
            examples.append(example)
    return examples


GSM8K_PLANS = (
    "I will write each step of the problem as a line of Python and print the answer.",
    "Let me name each quantity in the problem and let Python do the arithmetic.",
    "I will compute the quantities one at a time in Python.",
)
GSM8K_CONCLUSION = "The answer is \\boxed{{{answer}}}."


@dataclass(frozen=True)
class Gsm8kPlan:
    sft: list[Example]  # conversations to build, before the sandbox checks their programs
    rl: list[Example]  # the other convertible rows, as RL problems
    refused: list[NotConvertible]  # rows no program could be written for


def plan_gsm8k(rows: Sequence[dict], seed: int, count: int) -> Gsm8kPlan:
    """Every GSM8K training row turned into a program where its solution allows; `count` of them (a seeded
    draw) for SFT conversations, the rest for RL. Rows are dicts of the dataset's question, answer and idx."""
    from rstar.evals.gsm8k import gold_answer

    rng = random.Random(f"rstar.rl.sft_data/gsm8k/{seed}")
    planned, refused = [], []
    for n, row in enumerate(rows):
        index, gold = row.get("idx", n), gold_answer(row["answer"])
        try:
            program = solution_program(index, row["question"], row["answer"], gold)
        except NotConvertible as exc:
            refused.append(exc)
            continue
        planned.append(Example(id=f"gsm8k-{index:05d}", family="gsm8k", phrasing=f"gsm8k/{index}", split="train",
                               problem=row["question"].strip(), answer=gold,
                               calls=(PlannedCall(rng.choice(GSM8K_PLANS), program.code, fails=False),),
                               reading=rng.choice(READINGS), conclusion=GSM8K_CONCLUSION))
    chosen = set(rng.sample(range(len(planned)), min(count, len(planned))))
    return Gsm8kPlan([e for i, e in enumerate(planned) if i in chosen], [e for i, e in enumerate(planned) if i not in chosen], refused)


# --- running the programs (the sandbox edge) -------------------------------------------------------------


def tool_call_message(reason: str, code: str, call_id: str) -> dict:
    return {
        "role": "assistant",
        "content": f"<reason>{reason}",
        "tool_calls": [{"id": call_id, "type": "function",
                        "function": {"name": PYTHON_TOOL, "arguments": {"code": code, "input": ""}}}],
    }


class ProgramMismatch(RuntimeError):
    """A planned program did not do in the sandbox what its plan says (fail, or print the answer)."""


def prints_answer(output: str, answer: str) -> bool:
    """Whether a program's output is the answer as a number. Whole numbers compare exactly; a float's output
    (`72.0`, or `71.99999999999999` from its last bit) is the answer to within float rounding, `72.5` is not."""
    try:
        printed, expected = Fraction(output), Fraction(answer)
    except (ValueError, ZeroDivisionError):
        return output == answer
    if re.fullmatch(r"-?\d+", output):
        return printed == expected
    return abs(printed - expected) <= Fraction(1, 10**9) * max(1, abs(expected))


async def build_conversation(example: Example, executor: CodeExecutor) -> Example:
    """Run the planned programs in the sandbox and write the conversation around their real results."""
    messages: list[dict] = [{"role": "user", "content": example.problem}]
    output = ""
    for index, call in enumerate(example.calls):
        result = await executor.execute(PYTHON_TOOL, call.code, "", ())
        output = result.stdout.strip()
        if call.fails == result.ok or (not call.fails and not prints_answer(output, example.answer)):
            raise ProgramMismatch(
                f"{example.id} ({example.phrasing}): expected {'a failure' if call.fails else example.answer!r}, "
                f"the sandbox gave {render_exec_result(result, 'improved')!r} for:\n{call.code}")
        call_id = f"call_{index}"
        messages.append(tool_call_message(call.reason, call.code, call_id))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": render_exec_result(result, "improved")})
    messages.append({
        "role": "assistant",
        "content": f"<reason>{example.reading.format(output=output)}</reason>\n"
                   f"<answer>\n{example.conclusion.format(answer=example.answer)}\n</answer>",
    })
    return replace(example, messages=messages)


async def build_conversations(examples: Sequence[Example], executor: CodeExecutor,
                              progress: Callable[[int, int], None] = lambda done, total: None,
                              dropped: list[str] | None = None) -> list[Example]:
    """Every example with its conversation, in order. A program that does not do what its plan says raises
    ProgramMismatch, or, when `dropped` is given, is left out with its message appended there (for data this
    project did not write, where a solution's program may be wrong)."""
    slots = asyncio.Semaphore(CONCURRENT_CONVERSATIONS)
    done = 0

    async def build(example: Example) -> Example | None:
        nonlocal done
        async with slots:
            try:
                built = await build_conversation(example, executor)
            except ProgramMismatch as exc:
                if dropped is None:
                    raise
                dropped.append(str(exc))
                built = None
        done += 1
        progress(done, len(examples))
        return built

    return [built for built in await asyncio.gather(*(build(example) for example in examples)) if built is not None]


# --- files (the disk edge) -------------------------------------------------------------------------------

EXECUTION_TIME = re.compile(r"execution time: \d+\.\d\ds")


def content_sha256(text: str) -> str:
    """sha256 of a file's text with tool timings normalized, the only part that differs between runs."""
    return hashlib.sha256(EXECUTION_TIME.sub("execution time: X.XXs", text).encode()).hexdigest()


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


async def make_sft_data(out_dir: Path, seed: int = 0, n_train: int = 1000, n_heldout: int = 200, n_rl: int = 1000,
                        sandbox_settings: SandboxSettings | None = None,
                        progress: Callable[[int, int], None] = lambda done, total: None,
                        gsm8k_rows: Sequence[dict] = (), n_gsm8k: int = 0) -> dict:
    """Write sft_train.jsonl, heldout.jsonl, rl_train.jsonl and manifest.json into out_dir; return the manifest.

    The programs run in an in-process sandbox pool started here. RL problems use training phrasings with
    numbers from their own stream, and never repeat an SFT problem. With `gsm8k_rows` (GSM8K's training split),
    `n_gsm8k` of its solutions become conversations too (those whose program prints the gold answer in the
    sandbox), and its other convertible rows are written to gsm8k_rl_train.jsonl as RL problems.
    """
    train = generate_problems(seed, n_train, "train")
    heldout = generate_problems(seed, n_heldout, "heldout")
    rl = generate_problems(seed, n_rl, "train", stream="rl", avoid={example.problem for example in train})
    gsm8k = plan_gsm8k(gsm8k_rows, seed, n_gsm8k)
    mismatched: list[str] = []
    async with LocalClient(sandbox_settings or SandboxSettings()) as client:
        executor = SandboxExecutor(client)
        built = await build_conversations([*train, *heldout], executor, progress)
        gsm8k_built = await build_conversations(gsm8k.sft, executor, progress, dropped=mismatched)
    train, heldout = built[: len(train)] + gsm8k_built, built[len(train) :]

    files = {
        "sft_train.jsonl": (train, jsonl(example.row() for example in train)),
        "heldout.jsonl": (heldout, jsonl(example.row() for example in heldout)),
        "rl_train.jsonl": (rl, jsonl(example.rl_row() for example in rl)),
    }
    if gsm8k_rows:
        files["gsm8k_rl_train.jsonl"] = (gsm8k.rl, jsonl(example.rl_row() for example in gsm8k.rl))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "seed": seed,
        "heldout_phrasings": heldout_phrasing_ids(),
        "error_recovery_conversations": sum(len(example.calls) > 1 for example in train),
        "sha256_note": "of each file's text with every 'execution time: X.XXs' normalized",
        "files": {},
    }
    if gsm8k_rows:
        manifest["gsm8k"] = {
            "rows": len(gsm8k_rows),
            "refused": {reason: n for reason in REFUSALS if (n := sum(exc.reason == reason for exc in gsm8k.refused))},
            "converted": len(gsm8k.sft) + len(gsm8k.rl),
            "drawn_for_sft": len(gsm8k.sft),
            "program_did_not_print_the_answer": mismatched,
            "conversations": len(gsm8k_built),
            "rl_problems": len(gsm8k.rl),
        }
    for name, (examples, text) in files.items():
        write_atomically(out_dir / name, text)
        manifest["files"][name] = {
            "rows": len(examples),
            "families": dict(sorted(Counter(example.family for example in examples).items())),
            "sha256": content_sha256(text),
        }
    write_atomically(out_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return manifest
