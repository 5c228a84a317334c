"""The weight files an RL run shares with its engine (rl/grpo/weight_sync.py) do not outlive a killed trainer."""

from __future__ import annotations

import os
import subprocess
import sys

from rstar.process_temp import remove_orphans
from rstar.rl.grpo.weight_sync import WEIGHTS_PREFIX


def test_weights_of_a_trainer_that_is_gone_are_removed_and_a_live_ones_kept(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True).stdout.strip()
    orphan = tmp_path / f"rstar-weights-{gone}-k2mu6abc"
    orphan.mkdir()
    (orphan / "model.safetensors").write_bytes(b"\0" * 4096)
    running = tmp_path / f"rstar-weights-{os.getpid()}-q8f5wzqd"
    running.mkdir()
    unowned = tmp_path / "rstar-weights-gm6sksy8"  # no pid in its name (made before they carried one): not ours to judge
    unowned.mkdir()
    assert remove_orphans(WEIGHTS_PREFIX, tmp_path) == [orphan]
    assert not orphan.exists() and running.exists() and unowned.exists()
