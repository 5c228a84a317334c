"""RayPool on a real local Ray (ray is in the test extra): same interface, pools inside Ray actors."""

from __future__ import annotations

import asyncio

import ray  # noqa: F401 - a missing Ray is an install error here, not a reason to skip

from rstar.sandbox.clients import SandboxClient, connect
from rstar.sandbox.settings import SandboxSettings


def test_ray_pool_runs_cells_on_every_node(tmp_path):
    container = "cntr_" + "c" * 32
    (tmp_path / container / "data").mkdir(parents=True)
    settings = SandboxSettings(workers=1, uid_base=64000, preload=["numpy"], ray_pools_per_node=2, containers_dir=str(tmp_path))

    async def use():
        client = connect(settings, ray=True)
        assert isinstance(client, SandboxClient)
        async with client:
            one = await client.run({"code": "import numpy as np\nnp.arange(4).sum()"})
            many = await client.run_batch([{"code": f"print({i})"} for i in range(6)] + [{"code": 5}])
            session = [await client.run({"code": c, "session_id": "r"}) for c in ("k = 9", "k", "k + 1")]
            await client.close_session("r")
            in_container = [await client.run({"code": c, "container_id": container}) for c in ("k = 7", "k", "k + 1")]
            await client.close_container(container)
            verdict = await client.verify(r"<answer>\boxed{025}</answer>", "25")
            health = await client.health()
            for _ in range(100):  # the closed session's process may take a moment to die
                processes = await client.processes()
                if all(p["role"] in ("spare", "exiting") for table in processes for p in table):
                    break
                await asyncio.sleep(0.05)
        return one, many, session, in_container, verdict, health, processes

    one, many, session, in_container, verdict, health, processes = asyncio.run(use())
    assert one.stdout == "np.int64(6)\n"
    assert [r.stdout for r in many[:6]] == [f"{i}\n" for i in range(6)] and many[6].status == "invalid_input"
    assert [r.stdout for r in session[1:]] == ["9\n", "10\n"]  # a session sticks to one node pool
    assert [r.stdout for r in in_container[1:]] == ["7\n", "8\n"]  # a container's interpreter too, and is closed there
    assert verdict.correct
    assert health["status"] == "ok" and len(health["pools"]) == 2
    assert all(pool["layers"]["seccomp"]["active"] for pool in health["pools"])
    assert len(processes) == 2 and all(p["role"] in ("spare", "exiting") for table in processes for p in table)
    assert {p["uid"] // 1000 for p in processes[0]} != {p["uid"] // 1000 for p in processes[1]}  # disjoint uids
    assert not ray.is_initialized()  # the pool started the local Ray, so it shut it down


def test_a_pool_closing_leaves_ray_running_for_its_other_users():
    """The engine replicas and the sandbox pool join one Ray in `rstar serve`; the pool closing first must not
    shut it down under the replicas. The last user leaving does."""
    from rstar import ray_cluster

    async def use():
        await ray_cluster.join(None)  # another user: the engine replicas
        client = connect(SandboxSettings(workers=1, uid_base=64000, preload=[], ray_pools_per_node=1), ray=True)
        async with client:
            ran = await client.run({"code": "print(7)"})
        still_up = ray.is_initialized()
        await ray_cluster.leave()
        return ran, still_up

    ran, still_up = asyncio.run(use())
    assert ran.stdout == "7\n"
    assert still_up
    assert not ray.is_initialized()
