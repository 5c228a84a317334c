"""Running one cell the way rStar2-Agent's tools do, inside an already-hardened child.

- The last top-level bare expression is echoed with repr(), as IPython does (None is not echoed).
- Exceptions become `ErrType at line N: message` plus the offending source line on stderr, exit code 1,
  with no sandbox frames: line numbers are the cell's own.
- `jupyter_code` replay: earlier cells run first with their output sent to /dev/null and their errors
  ignored (they were reported when they first ran), then the new cell runs normally.
"""

from __future__ import annotations

import ast
import builtins
import os
import sys
import traceback

CELL_FILENAME = "<cell>"


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
        code = stop.code
        if code is None or code == 0:
            return "ok", 0
        if isinstance(code, int):
            return "error", code & 0xFF
        print(code, file=sys.stderr)
        return "error", 1
    except MemoryError as exc:
        _report(exc, source)
        return "memory", 1
    except BaseException as exc:  # noqa: BLE001 - the cell's own exceptions are its result
        _report(exc, source)
        return "error", 1


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
