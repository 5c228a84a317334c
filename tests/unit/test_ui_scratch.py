"""The UI's download directory: downloads older than the limit go at the next download, newer ones stay."""

import os
import time

from rstar.ui.scratch import Scratch


def test_new_download_prunes_only_the_expired_ones():
    scratch = Scratch(max_age_s=60)
    try:
        old, recent = scratch.new_dir(), scratch.new_dir()
        (old / "export.json").write_text("{}")
        hour_ago = time.time() - 3600
        os.utime(old, (hour_ago, hour_ago))
        latest = scratch.new_dir()
        assert not old.exists()
        assert recent.is_dir() and latest.is_dir() and latest.parent == scratch.root
    finally:
        scratch.close()
    assert not scratch.root.exists()


def test_prune_counts_what_it_removed():
    scratch = Scratch(max_age_s=60)
    try:
        scratch.new_dir()
        assert scratch.prune() == 0
        assert scratch.prune(now=time.time() + 61) == 1
        assert list(scratch.root.iterdir()) == []
    finally:
        scratch.close()
