"""The API app over real HTTP on the session's real engine, with the async openai client."""

from __future__ import annotations

import asyncio

import openai


def test_async_client_runs_concurrent_requests(live_server):
    async def main():
        client = openai.AsyncOpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused")
        requests = [
            client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": f"Say the number {i}."}], max_tokens=8, temperature=0)
            for i in range(4)
        ]
        return await asyncio.gather(*requests)

    completions = asyncio.run(main())
    assert len(completions) == 4
    assert all(c.usage.completion_tokens > 0 and c.choices[0].message.content for c in completions)


def test_n_samples_with_a_seed_are_reproducible(live_server):
    client = openai.OpenAI(base_url=f"{live_server.base_url}/v1", api_key="unused")
    ask = dict(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Tell me a word."}], max_tokens=8, temperature=1.0, n=3, seed=7)
    first = [c.message.content for c in client.chat.completions.create(**ask).choices]
    second = [c.message.content for c in client.chat.completions.create(**ask).choices]
    assert first == second
    assert len(set(first)) > 1  # distinct seeds per choice
