"""The figures a cell drew with matplotlib, returned as PNG beside its output.

Inside a cell's process, once its code has run, `collect` turns every figure the cell left open into a PNG,
in the order the figures were made, and closes them (a session's next cell starts with none, as a notebook's
does). Under the improved protocol `plt.show()` renders the figures open at that moment and closes them, as a
notebook's inline backend does, so a figure shown and then closed is returned too; under `released` show keeps
matplotlib's own behaviour (a warning on stderr), since the released model was trained on code-judge's output.

Caps (`Limits`, from the sandbox settings): figures per cell, pixels per figure (checked before rendering, so
an oversized one costs nothing) and PNG bytes per figure. A figure past a cap is left out and `collect`
says why in a note.

A cell that never draws pays one dict lookup: matplotlib is imported by the warm image (`warm_up`), and a
process with no open figure renders nothing. Nothing here imports matplotlib at module level.
"""

from __future__ import annotations

import base64
import io
import struct
import sys
from dataclasses import dataclass

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A PNG's first chunk is IHDR: after the 8-byte signature, 4 bytes length, 4 bytes type, then width, height.
_IHDR = struct.Struct(">8sI4sII")


@dataclass(frozen=True)
class Limits:
    max_images: int
    max_pixels: int
    max_bytes: int

    @classmethod
    def of_config(cls, cfg: dict) -> "Limits":
        return cls(int(cfg["max_images"]), int(cfg["max_pixels"]), int(cfg["max_bytes"]))

    def status_bytes(self) -> int:
        """The most a child's status line can carry for its images: base64 of every allowed PNG, plus room for
        the rest of the line and the notes."""
        return self.max_images * (4 * -(-self.max_bytes // 3) + 256) + 64 * 1024


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, read from its header; ValueError when `data` is not a PNG."""
    if len(data) < _IHDR.size:
        raise ValueError("too short to be a PNG")
    signature, _, kind, width, height = _IHDR.unpack_from(data)
    if signature != PNG_SIGNATURE or kind != b"IHDR":
        raise ValueError("not a PNG")
    return width, height


class _Capture:
    """The images and notes of the cell being run."""

    def __init__(self, limits: Limits, capture_show: bool) -> None:
        self.limits = limits
        self.capture_show = capture_show
        self.images: list[dict] = []
        self.notes: list[str] = []
        self.figures = 0  # figures met so far in this cell, shown or left open: their numbers in the notes
        self.over_count = 0  # figures past max_images

    def add(self, figure) -> None:
        if not figure.axes and not figure.artists and not figure.images and not figure.texts:
            return  # nothing was drawn on it (e.g. plt.clf() after a show made a new, empty figure)
        self.figures += 1
        number = self.figures
        if len(self.images) >= self.limits.max_images:
            self.over_count += 1
            return
        try:
            self.images.append(self.render(figure, number))
        except _Refused as refused:
            self.notes.append(str(refused))
        except Exception as exc:  # noqa: BLE001 - the cell's figure failed to draw: its note says how
            self.notes.append(f"figure {number} not returned: {type(exc).__name__}: {exc}")

    def render(self, figure, number: int) -> dict:
        import matplotlib

        limits = self.limits
        dpi = matplotlib.rcParams["savefig.dpi"]
        dpi = figure.dpi if dpi == "figure" else float(dpi)
        inches_w, inches_h = figure.get_size_inches()
        self.check_pixels(number, round(inches_w * dpi), round(inches_h * dpi))
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=dpi)
        data = buffer.getvalue()
        width, height = png_size(data)
        self.check_pixels(number, width, height)  # a tight bounding box (rcParams) makes it another size
        if len(data) > limits.max_bytes:
            raise _Refused(f"figure {number} not returned: its PNG is {len(data)} bytes, over the {limits.max_bytes}-byte cap (max_image_bytes)")
        return {"format": "png", "width": width, "height": height, "data": base64.b64encode(data).decode("ascii")}

    def check_pixels(self, number: int, width: int, height: int) -> None:
        if width * height > self.limits.max_pixels:
            raise _Refused(f"figure {number} not returned: {width}x{height} pixels is over the {self.limits.max_pixels}-pixel cap (max_image_pixels)")

    def take_open_figures(self) -> None:
        """Render every open figure, oldest first, and close them all."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        numbers = pyplot.get_fignums()
        if not numbers:
            return
        from matplotlib._pylab_helpers import Gcf

        managers = {manager.num: manager for manager in Gcf.get_all_fig_managers()}
        for number in numbers:
            if number in managers:
                self.add(managers[number].canvas.figure)
        pyplot.close("all")

    def result(self) -> tuple[list[dict], list[str]]:
        notes = list(self.notes)
        if self.over_count:
            figures = "figure" if self.over_count == 1 else "figures"
            notes.append(f"{self.over_count} more {figures} not returned: at most {self.limits.max_images} per cell (max_images_per_cell)")
        return self.images, notes


class _Refused(Exception):
    pass


# The cell being run: its limits and protocol, set by `begin` without allocating anything (a cell that draws
# nothing must not even dirty a page for this), and its `_Capture`, made only once there is a figure to take.
_limits: Limits | None = None
_capture_show = False
_capture: _Capture | None = None
_stock_show = None  # pyplot.show as matplotlib defines it, once `warm_up` has replaced it
_NOTHING: tuple[list, list] = ([], [])  # collect's answer for a cell with no figure; never mutated


def begin(limits: Limits, capture_show: bool) -> None:
    """Before a cell runs: start collecting its figures (`capture_show`: plt.show() renders and closes them)."""
    global _limits, _capture_show, _capture
    _limits, _capture_show, _capture = limits, capture_show, None


def _open_figures() -> bool:
    helpers = sys.modules.get("matplotlib._pylab_helpers")
    return helpers is not None and bool(helpers.Gcf.figs)


def _current() -> _Capture:
    global _capture
    if _capture is None:
        _capture = _Capture(_limits, _capture_show)
    return _capture


def discard() -> None:
    """Forget the figures made so far (the jupyter_code replay's, which were returned when those cells ran)."""
    global _capture
    if _open_figures():
        sys.modules["matplotlib.pyplot"].close("all")
    _capture = None


def collect() -> tuple[list[dict], list[str]]:
    """After a cell ran: (images, notes). Images are {"format": "png", "width", "height", "data": base64}."""
    global _limits, _capture
    if _limits is None or (_capture is None and not _open_figures()):
        _limits = None
        return _NOTHING
    capture = _current()
    _limits, _capture = None, None
    try:
        capture.take_open_figures()
    except Exception as exc:  # noqa: BLE001 - a cell can break pyplot itself; its output still stands
        capture.notes.append(f"figures not returned: {type(exc).__name__}: {exc}")
    return capture.result()


def _show(*args, **kwargs):
    """pyplot.show in a cell: under the improved protocol, the open figures become images and close."""
    if _limits is not None and _capture_show:
        _current().take_open_figures()
        return None
    return _stock_show(*args, **kwargs)


def warm_up() -> None:
    """Put matplotlib in the warm image: the Agg backend, pyplot, and the PNG writer (Pillow's, which
    matplotlib would import at a cell's first savefig); pyplot.show replaced by `_show`.

    No figure is drawn here, though that would warm the fonts and text layout too: measured, it made each
    fork of the image fault in about 140 more pages even for `print(1)` (the C heap the fonts leave behind),
    and saved a figure cell only a few percent more than this does."""
    global _stock_show
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.pyplot as pyplot
    from PIL import Image

    Image.preinit()  # registers the PNG plugin, as Image.save would on first use
    if _stock_show is None:
        _stock_show = pyplot.show
        pyplot.show = _show
