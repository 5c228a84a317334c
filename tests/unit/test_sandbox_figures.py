"""Figures a cell draws come back as PNG (sandbox/figures.py), in real zygotes: sizes, order, caps, sessions,
replay, and nothing for a cell that draws none."""

from __future__ import annotations

import base64

import pytest

from rstar.sandbox import figures
from tests.unit.conftest import SyncPool

SLOW = {"timeout_s": 30.0}  # rendering takes a while on a loaded 2-core machine; the default 2 s is for print(1)

TWO_FIGURES = """
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
fig = plt.figure(figsize=(3, 2))
fig.gca().bar([1, 2], [3, 1])
print("drawn")
"""


def decoded(result) -> list[tuple[int, int]]:
    """(width, height) of every returned image, read from the PNG bytes themselves."""
    sizes = []
    for image in result.images:
        data = base64.b64decode(image.data, validate=True)
        assert data.startswith(figures.PNG_SIGNATURE)
        assert figures.png_size(data) == (image.width, image.height)
        sizes.append((image.width, image.height))
    return sizes


def test_two_figures_come_back_as_two_pngs_in_order(sandbox_pool):
    result = sandbox_pool.run(TWO_FIGURES, **SLOW)
    assert result.ok and result.stdout == "drawn\n" and result.stderr == "", result
    assert decoded(result) == [(640, 480), (300, 200)]
    assert result.image_notes == []


def test_a_cell_without_figures_has_no_images(sandbox_pool):
    result = sandbox_pool.run("print(1)")
    assert result.ok and result.images == [] and result.image_notes == []
    closed = sandbox_pool.run("import matplotlib.pyplot as plt\nfig = plt.figure(); fig.gca().plot([1]); plt.close(fig)", **SLOW)
    assert closed.ok and closed.images == [], closed


def test_improved_show_returns_the_figure_even_if_closed_after(sandbox_pool):
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nplt.close('all')\nplt.clf()"
    improved = sandbox_pool.run(code, **SLOW)
    assert improved.ok and improved.stderr == "" and decoded(improved) == [(640, 480)], improved
    # released: show is matplotlib's own, so a figure closed after it is gone, as it was under code-judge
    released = sandbox_pool.run(code, protocol="released", **SLOW)
    assert released.ok and released.images == [], released
    left_open = sandbox_pool.run("import matplotlib.pyplot as plt\nplt.plot([1, 2])", protocol="released", **SLOW)
    assert decoded(left_open) == [(640, 480)]


def test_a_session_cell_returns_only_its_own_figures(sandbox_pool):
    first = sandbox_pool.run("import matplotlib.pyplot as plt\nplt.plot([1, 2])", session_id="figures", **SLOW)
    second = sandbox_pool.run("plt.figure(figsize=(2, 2)).gca().plot([3])", session_id="figures", **SLOW)
    third = sandbox_pool.run("print(len(plt.get_fignums()))", session_id="figures", **SLOW)
    sandbox_pool.call(sandbox_pool.pool.close_session("figures"))
    assert decoded(first) == [(640, 480)] and decoded(second) == [(200, 200)]
    assert third.stdout == "0\n" and third.images == []


def test_replayed_cells_return_no_figures(sandbox_pool):
    result = sandbox_pool.run("plt.figure(figsize=(2, 1)).gca().plot([1])", tool="jupyter_code",
                              history=["import matplotlib.pyplot as plt\nplt.plot([1, 2])"], **SLOW)
    assert result.ok and decoded(result) == [(200, 100)], result


CAPPED = """
import numpy as np
import matplotlib.pyplot as plt
plt.figure(figsize=(4, 3)).gca().plot([1, 2])                            # 1: returned
plt.figure(figsize=(4, 3)).gca().imshow(np.random.default_rng(0).random((300, 400)))  # 2: noise, too many bytes
plt.figure(figsize=(10, 10)).gca().plot([1, 2])                          # 3: too many pixels
plt.figure(figsize=(4, 3)).gca().plot([2, 1])                            # 4: returned
plt.figure(figsize=(4, 3)).gca().plot([3, 1])                            # 5: past the count
plt.figure(figsize=(4, 3)).gca().plot([4, 1])                            # 6: past the count
"""


@pytest.fixture(scope="module")
def capped_pool():
    from rstar.sandbox.settings import SandboxSettings

    settings = SandboxSettings(workers=1, spare_cells=1, max_sessions=1, uid_base=64100, timeout_s=30.0,
                               max_images_per_cell=2, max_image_pixels=200_000, max_image_bytes=40_000)
    pool = SyncPool(settings)
    yield pool
    pool.close()


def test_caps_leave_figures_out_with_a_note_each(capped_pool):
    result = capped_pool.run(CAPPED)
    assert result.ok, result
    assert decoded(result) == [(400, 300), (400, 300)]
    notes = result.image_notes
    assert len(notes) == 3, notes
    assert notes[0].startswith("figure 2 not returned: its PNG is ") and "over the 40000-byte cap (max_image_bytes)" in notes[0]
    assert notes[1] == "figure 3 not returned: 1000x1000 pixels is over the 200000-pixel cap (max_image_pixels)"
    assert notes[2] == "2 more figures not returned: at most 2 per cell (max_images_per_cell)"
    assert all(len(base64.b64decode(image.data)) <= 40_000 for image in result.images)


def test_png_size_reads_the_header_and_refuses_other_bytes():
    header = figures.PNG_SIGNATURE + (13).to_bytes(4, "big") + b"IHDR" + (640).to_bytes(4, "big") + (480).to_bytes(4, "big")
    assert figures.png_size(header) == (640, 480)
    with pytest.raises(ValueError):
        figures.png_size(b"GIF89a" + header[6:])
    with pytest.raises(ValueError):
        figures.png_size(header[:20])


def test_the_status_line_has_room_for_every_allowed_image():
    limits = figures.Limits(max_images=8, max_pixels=4_194_304, max_bytes=2_097_152)
    assert limits.status_bytes() > 8 * len(base64.b64encode(bytes(2_097_152)))
