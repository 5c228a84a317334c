"""Running one cell the way rStar2-Agent's tools do, inside an already-hardened child.

- The last top-level bare expression is echoed with repr(), as IPython does (None is not echoed).
- Exceptions become `ErrType at line N: message` plus the offending source line on stderr, exit code 1,
  with no sandbox frames: line numbers are the cell's own.
- `jupyter_code` replay: earlier cells run first with their output sent to /dev/null and their errors
  ignored (they were reported when they first ran), then the new cell runs normally.

`run_cell_released` is the `released` protocol's variant: the same steps as the wrapper rStar2-Agent sent
to code-judge (microsoft/rStar `rstar2_agent/tools/code_judge_utils.py`), with its quirks kept because the
released model was trained on their output: the last expression is split off by source *lines*, its
error is located in those lines alone, the error line is the traceback's deepest frame (a library's, if
that is where it was raised), the offending line is shown raw after two spaces, and stdout still buffered
when an exception escapes is lost (the wrapper ended with os._exit(1)).
"""

from __future__ import annotations

import ast
import builtins
import os
import sys
import traceback

CELL_FILENAME = "<cell>"


def preload(modules: list[str]) -> None:
    """Import what cells will use, so no cell pays for it (the zygote does this once before forking)."""
    if any(name == "matplotlib" or name.startswith("matplotlib.") for name in modules):
        from . import figures

        figures.warm_up()  # the Agg backend chosen before pyplot loads, and pyplot.show made to return figures
    for name in modules:
        __import__(name)
    if "sympy" in modules:
        # sympy builds some caches lazily on first use; pay that once here, not in every cell.
        import sympy

        sympy.Symbol("x") + 1


def new_namespace() -> dict:
    return {"__name__": "__main__", "__builtins__": builtins}


def _compile_cell(source: str, echo: bool):
    """Compile to (statements, last expression or None), so the expression's value can be echoed."""
    tree = ast.parse(source, CELL_FILENAME, "exec")
    last = None
    if echo and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, CELL_FILENAME, "exec")
    return body, (compile(last, CELL_FILENAME, "eval") if last is not None else None)


def format_error(exc: BaseException, source: str) -> str:
    """`ErrType at line N: message` + the offending line, as rStar2-Agent's wrapper reports errors."""
    name = type(exc).__name__
    message = str(exc)
    lineno, text = None, None
    if isinstance(exc, SyntaxError) and exc.filename == CELL_FILENAME:
        lineno, text, message = exc.lineno, exc.text, exc.msg
    else:
        # Deepest frame that belongs to the cell: the line the model wrote, not numpy's or ours.
        for frame, frame_line in traceback.walk_tb(exc.__traceback__):
            if frame.f_code.co_filename == CELL_FILENAME:
                lineno = frame_line
    if lineno is None:
        return f"{name}: {message}" if message else name
    if text is None:
        lines = source.splitlines()
        text = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
    head = f"{name} at line {lineno}: {message}" if message else f"{name} at line {lineno}"
    return f"{head}\n    {text.strip()}" if text and text.strip() else head


def run_cell(source: str, namespace: dict, *, echo: bool = True) -> tuple[str, int]:
    """Run one cell in `namespace`; returns (status, exit_code) with status ok, error or memory."""
    try:
        body, last = _compile_cell(source, echo)
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                print(repr(value))
        return "ok", 0
    except SystemExit as stop:
        return _exit_status(stop)
    except MemoryError as exc:
        _report(exc, source)
        return "memory", 1
    except BaseException as exc:  # noqa: BLE001 - the cell's own exceptions are its result
        _report(exc, source)
        return "error", 1


def _exit_status(stop: SystemExit) -> tuple[str, int]:
    """sys.exit(code) ends a cell as it ends a process: 0/None is success, an int its status, text goes to stderr."""
    code = stop.code
    if code is None or code == 0:
        return "ok", 0
    if isinstance(code, int):
        return "error", code & 0xFF
    print(code, file=sys.stderr)
    return "error", 1


def format_error_released(exc: BaseException, source: str, line_offset: int = 0) -> str:
    """The wrapper's error text: `ErrType at line N: msg` + newline + two spaces + the raw line, where N is the
    exception's own `lineno` if it has one (SyntaxError, but also e.g. json's decode errors) or else the
    deepest traceback frame's line, shifted by `line_offset`, looked up in `source`; `ErrType: msg` when
    that line is not in `source`."""
    if hasattr(exc, "lineno"):
        lineno = exc.lineno
    else:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        lineno = tb.tb_lineno if tb is not None else -1
    if isinstance(lineno, int) and lineno != -1:
        lines = source.splitlines()
        lineno += line_offset
        if 0 <= lineno - 1 < len(lines):
            return f"{type(exc).__name__} at line {lineno}: {exc}\n  {lines[lineno - 1]}"
    return f"{type(exc).__name__}: {exc}"


class _ReleasedError(Exception):
    """An exception of the cell, with the text the released wrapper printed for it."""

    def __init__(self, exc: BaseException, text: str) -> None:
        super().__init__(text)
        self.exc = exc


def _split_last_expression(source: str) -> tuple[str, str | None]:
    """(body, last expression) split by source lines, as the released wrapper split them."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise _ReleasedError(exc, format_error_released(exc, source)) from exc
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return source, None
    last = tree.body[-1]
    lines = source.splitlines()
    return "\n".join(lines[: last.lineno - 1]), "\n".join(lines[last.lineno - 1 : last.end_lineno])


def run_cell_released(source: str, namespace: dict) -> tuple[str, int]:
    """Run one cell as the released wrapper did; returns (status, exit_code) like `run_cell`.

    A failing last expression is run again as a statement before it counts as an error (the wrapper
    retried it that way, so its side effects happen twice). SystemExit and other BaseExceptions were
    not the wrapper's to catch: they end the cell as they end a python3 process, output kept.
    """
    namespace.setdefault("__file__", "<string>")
    try:
        body, last = _split_last_expression(source)
        if body:
            try:
                exec(compile(body, CELL_FILENAME, "exec"), namespace)
            except Exception as exc:
                raise _ReleasedError(exc, format_error_released(exc, body)) from exc
        if last:
            try:
                value = eval(compile(last, CELL_FILENAME, "eval"), namespace)
                if value is not None:
                    print(repr(value))
            except Exception:
                try:
                    exec(compile(last, CELL_FILENAME, "exec"), namespace)
                except Exception as exc:
                    offset = len(body.splitlines()) if body else 0
                    raise _ReleasedError(exc, format_error_released(exc, last, offset)) from exc
        return "ok", 0
    except _ReleasedError as error:
        _discard_buffered_stdout()
        try:
            print(str(error), file=sys.stderr)
        except MemoryError:
            os.write(2, f"{type(error.exc).__name__}\n".encode())
        return ("memory" if isinstance(error.exc, MemoryError) else "error"), 1
    except SystemExit as stop:
        return _exit_status(stop)
    except BaseException as exc:  # noqa: BLE001 - e.g. KeyboardInterrupt raised by the cell itself
        _report(exc, source)
        return "error", 1


def _discard_buffered_stdout() -> None:
    """Drop what the cell printed but Python has not written yet, as os._exit does: flush it into /dev/null."""
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - a cell may have closed or replaced stdout
            pass
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def _report(exc: BaseException, source: str) -> None:
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - a cell may have closed or replaced stdout
        pass
    try:
        print(format_error(exc, source), file=sys.stderr)
    except MemoryError:
        os.write(2, f"{type(exc).__name__}\n".encode())


def replay(cells: list[str], namespace: dict) -> None:
    """Run earlier cells silently: both stdio fds point at /dev/null meanwhile, so C-level writes vanish too."""
    if not cells:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        for source in cells:
            run_cell(source, namespace, echo=False)
            sys.stdout.flush()
            sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)
