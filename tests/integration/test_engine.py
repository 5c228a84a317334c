"""server/engine.py on real vLLM with the default model: generate, stream, abort, reload weights, shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil

import psutil
import pytest
from safetensors.torch import load_file, save_file

from rstar.config import EngineSettings
from rstar.server.engine import EngineFailed, SamplingOptions, VllmEngine
from tests.waiting import wait_for

GREEDY = SamplingOptions(max_tokens=12, temperature=0.0, logprobs=0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompt_ids(engine):
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Name three prime numbers."}], add_generation_prompt=True, tokenize=False)
    return engine.tokenizer.encode(text, add_special_tokens=False)


async def collect(engine, prompt_ids, options, request_id=None):
    return [delta async for delta in engine.generate(prompt_ids, options, request_id)]


def test_generate_is_deterministic_at_temperature_zero(engine, loop_thread, prompt_ids):
    first = loop_thread.run(collect(engine, prompt_ids, GREEDY))
    second = loop_thread.run(collect(engine, prompt_ids, GREEDY))
    ids = [t for d in first for t in d.token_ids]
    assert len(ids) == 12
    assert ids == [t for d in second for t in d.token_ids]
    assert first[-1].finished and first[-1].finish_reason == "length"
    assert first[-1].num_prompt_tokens == len(prompt_ids)
    assert engine.stats().unfinished == 0


def test_stream_delivers_tokens_text_and_logprobs_incrementally(engine, loop_thread, prompt_ids):
    deltas = loop_thread.run(collect(engine, prompt_ids, SamplingOptions(max_tokens=16, temperature=0.0, logprobs=2, ignore_eos=True)))
    assert len(deltas) > 1  # streamed, not one final blob
    ids = [t for d in deltas for t in d.token_ids]
    logprobs = [lp for d in deltas for lp in d.logprobs]
    assert len(logprobs) == len(ids) == 16
    assert all(lp <= 0 for lp in logprobs)
    # Greedy picks the top token, so its logprob is the best of the top-2 list.
    for delta in deltas:
        for token, lp, top in zip(delta.token_ids, delta.logprobs, delta.top_logprobs):
            assert token in top and abs(max(top.values()) - lp) < 1e-6
    assert "".join(d.text for d in deltas) == engine.tokenizer.decode(ids)


def test_closing_a_stream_early_aborts_it_in_the_engine(engine, loop_thread, prompt_ids):
    async def read_two_then_close():
        stream = engine.generate(prompt_ids, SamplingOptions(max_tokens=500, temperature=0.0, ignore_eos=True))
        got = [await anext(stream), await anext(stream)]
        await stream.aclose()
        return got

    assert len(loop_thread.run(read_two_then_close())) == 2
    wait_for(lambda: engine.stats().unfinished == 0)


def test_abort_by_request_id_ends_the_stream(engine, loop_thread, prompt_ids):
    async def abort_midway():
        deltas = []

        async def consume():
            async for delta in engine.generate(prompt_ids, SamplingOptions(max_tokens=500, temperature=0.0, ignore_eos=True), "to-abort"):
                deltas.append(delta)

        task = asyncio.create_task(consume())
        while not deltas:
            await asyncio.sleep(0.01)
        await engine.abort("to-abort")
        await asyncio.wait_for(task, 30)
        return deltas

    deltas = loop_thread.run(abort_midway())
    assert sum(len(d.token_ids) for d in deltas) < 500
    wait_for(lambda: engine.stats().unfinished == 0)


def test_input_the_engine_refuses_is_a_value_error_before_any_delta(engine, loop_thread, prompt_ids):
    """vLLM validates token ids where the request is added; that check must reach the caller as ValueError (the
    API's 400) and leave the engine serving."""
    outside_vocabulary = [*prompt_ids, len(engine.tokenizer) + 1000]
    with pytest.raises(ValueError, match="(?i)token"):
        loop_thread.run(collect(engine, outside_vocabulary, GREEDY))
    assert engine.stats().unfinished == 0
    assert len([t for d in loop_thread.run(collect(engine, prompt_ids, GREEDY)) for t in d.token_ids]) == 12


def test_penalties_reach_vllm_and_cut_repetition(engine, loop_thread, prompt_ids):
    def most_repeated(options: SamplingOptions) -> tuple[list[int], int]:
        ids = [t for d in loop_thread.run(collect(engine, prompt_ids, options)) for t in d.token_ids]
        return ids, max(ids.count(t) for t in ids)

    plain = SamplingOptions(max_tokens=96, temperature=0.0, ignore_eos=True)
    plain_ids, plain_most = most_repeated(plain)
    penalised_ids, penalised_most = most_repeated(dataclasses.replace(plain, frequency_penalty=2.0))
    assert penalised_ids != plain_ids and penalised_most < plain_most, (plain_most, penalised_most)
    assert most_repeated(dataclasses.replace(plain, repetition_penalty=1.5))[0] != plain_ids
    assert most_repeated(dataclasses.replace(plain, presence_penalty=2.0))[0] != plain_ids


def test_stats_report_running_requests_and_kv_usage(engine, loop_thread, prompt_ids):
    async def sample_stats_while_busy():
        options = SamplingOptions(max_tokens=64, temperature=0.0, ignore_eos=True)
        tasks = [asyncio.create_task(collect(engine, prompt_ids, options)) for _ in range(4)]
        seen = []
        while not all(t.done() for t in tasks):
            seen.append(engine.stats())
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        return seen

    seen = loop_thread.run(sample_stats_while_busy())
    assert max(s.unfinished for s in seen) == 4
    assert max(s.running for s in seen) >= 1
    assert max(s.kv_cache_usage for s in seen) > 0


def test_reload_weights_changes_logprobs_and_restores_them(engine, loop_thread, prompt_ids, default_model_dir, tmp_path):
    # Every reading starts from an empty prefix cache (a reload drops it): in bf16 a prompt read back from
    # the cache gives logprobs a few hundredths away from one computed afresh, which is not what is tested.
    loop_thread.run(engine.llm.reset_prefix_cache())
    baseline = _greedy_logprobs(engine, loop_thread, prompt_ids)
    tensors = load_file(default_model_dir / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.5  # sharpens every logit
    changed_dir = tmp_path / "changed"
    changed_dir.mkdir()
    save_file(tensors, changed_dir / "model.safetensors")

    version = engine.weight_version
    loop_thread.run(engine.reload_weights(changed_dir))
    changed = _greedy_logprobs(engine, loop_thread, prompt_ids)
    assert max(abs(a - b) for a, b in zip(baseline, changed)) > 0.05
    assert engine.weight_version == version + 1

    original_dir = tmp_path / "original"
    original_dir.mkdir()
    shutil.copy(default_model_dir / "model.safetensors", original_dir / "model.safetensors")
    loop_thread.run(engine.reload_weights(original_dir))
    assert _greedy_logprobs(engine, loop_thread, prompt_ids) == pytest.approx(baseline, abs=1e-4)


def test_reload_from_a_directory_without_weights_is_refused(engine, loop_thread, tmp_path):
    with pytest.raises(FileNotFoundError, match="safetensors"):
        loop_thread.run(engine.reload_weights(tmp_path))


def test_shutdown_leaves_no_engine_process(default_model_dir, loop_thread, prompt_ids):
    def vllm_children() -> set[int]:
        return {p.pid for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM::") and p.status() != psutil.STATUS_ZOMBIE}

    others = vllm_children()  # the module's engine
    engine = loop_thread.run(VllmEngine.start(default_model_dir, EngineSettings(max_model_len=512, max_num_seqs=2, enforce_eager=True)))
    ours = vllm_children() - others
    assert ours, "the engine core runs in child processes"
    loop_thread.run(engine.shutdown())
    wait_for(lambda: not (vllm_children() & ours))
    with pytest.raises(EngineFailed, match="shut down"):
        loop_thread.run(collect(engine, prompt_ids, GREEDY))


def _greedy_logprobs(engine, loop_thread, prompt_ids) -> list[float]:
    return [lp for d in loop_thread.run(collect(engine, prompt_ids, GREEDY)) for lp in d.logprobs]


def test_many_seeded_requests_with_long_prompts_do_not_kill_the_engine(engine, loop_thread):
    """vLLM CPU's chunked prefill rewinds a seeded request's generator, which CPU generators cannot do, and
    the engine dies; 48 concurrent seeded requests of ~470 prompt tokens reproduced it within seconds."""
    prompt = engine.tokenizer.encode("word " * 470)

    async def one(seed: int) -> int:
        options = SamplingOptions(max_tokens=8, temperature=1.0, seed=seed)
        return sum([len(d.token_ids) async for d in engine.generate(prompt + [seed], options)])

    async def all_of_them():
        return await asyncio.gather(*(one(seed) for seed in range(48)))

    assert loop_thread.run(all_of_them(), timeout=600) == [8] * 48
