"""The `released` protocol in the real sandbox: results written as code-judge wrote them for rStar2-Agent's
wrapper (error line, lost stdout, 'Suicide from timeout.', 256 + 128 MB of address space), next to the
sandbox's own `improved` semantics for the same programs."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from rstar.sandbox.harden import CODE_JUDGE_ADDRESS_SPACE, CODE_JUDGE_PRELUDE, fresh_python_address_space

MB = 1024 * 1024


def released(pool, code, **fields):
    return pool.run(code, protocol="released", **fields)


# Expected texts below are what rStar's wrapper (code_judge_utils.py @ ecbfb943) printed for the same
# programs under a plain python3, checked by running it.


def test_error_line_is_two_spaces_and_the_raw_line(sandbox_pool):
    code = "a = 1\nb = [1, 2]\nc = b[5]\nprint(c)"
    r = released(sandbox_pool, code)
    assert (r.status, r.exit_code) == ("error", 1)
    assert r.stderr == "IndexError at line 3: list index out of range\n  c = b[5]\n"
    assert sandbox_pool.run(code).stderr == "IndexError at line 3: list index out of range\n    c = b[5]\n"


def test_error_in_a_function_keeps_its_indentation(sandbox_pool):
    r = released(sandbox_pool, "def f(x):\n    return x / 0\n\nf(1) + 1\nprint('after')\n")
    assert r.stderr == "ZeroDivisionError at line 2: division by zero\n      return x / 0\n"


def test_deepest_frame_is_used_even_when_it_is_a_librarys(sandbox_pool):
    # numpy raises deep in its own file, at a line number past this two-line cell: the wrapper then had
    # no line to show. The sandbox's own semantics point at the cell's line instead.
    code = "import numpy as np\nx = np.linalg.inv(np.zeros((2, 2)))\n"
    assert released(sandbox_pool, code).stderr == "LinAlgError: Singular matrix\n"
    assert sandbox_pool.run(code).stderr.startswith("LinAlgError at line 2: Singular matrix")


def test_failing_last_expression_of_a_longer_cell_has_no_line(sandbox_pool):
    assert released(sandbox_pool, "a = 1\nb = [1, 2]\nprint(b[5])\n").stderr == "IndexError: list index out of range\n"
    assert released(sandbox_pool, "x = 0\n1 / x").stderr == "ZeroDivisionError: division by zero\n"
    assert released(sandbox_pool, "1 / 0").stderr == "ZeroDivisionError at line 1: division by zero\n  1 / 0\n"


def test_syntax_error_as_ast_reported_it(sandbox_pool):
    r = released(sandbox_pool, "x = (1,\nprint(x)")
    assert r.exit_code == 1 and r.stderr.startswith("SyntaxError at line 1: '(' was never closed (<unknown>, line 1)\n  x = (1,")


def test_no_stdout_after_an_uncaught_exception(sandbox_pool):
    code = 'print("before")\nraise ValueError("bad")\n'
    r = released(sandbox_pool, code)
    assert (r.stdout, r.stderr) == ("", 'ValueError at line 2: bad\n  raise ValueError("bad")\n')
    assert sandbox_pool.run(code).stdout == "before\n"
    # Without an exception, buffered output arrives whole; sys.exit keeps it too (the wrapper did not catch it).
    assert released(sandbox_pool, "print('a')\n6 * 7").stdout == "a\n42\n"
    r = released(sandbox_pool, "import sys\nprint('kept')\nsys.exit(3)")
    assert (r.stdout, r.exit_code) == ("kept\n", 3)


def test_wall_timeout_prints_suicide_after_the_buffered_output(sandbox_pool):
    r = released(sandbox_pool, "print('working')\nimport time\ntime.sleep(30)", timeout_s=1.0)
    assert (r.status, r.stdout) == ("timeout", "working\nSuicide from timeout.\n")
    assert 1.0 <= r.duration_s < 2.0
    assert sandbox_pool.run("print('working')\nimport time\ntime.sleep(30)", timeout_s=1.0).stdout == "working\n"


def code_judge_outcome(size: int) -> str:
    """What a fresh python3 under code-judge's cap does with the same allocation (its prologue's RLIMIT_AS)."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (CODE_JUDGE_ADDRESS_SPACE, resource.RLIM_INFINITY))

    program = f"{CODE_JUDGE_PRELUDE}\ntry:\n    b = bytearray({size})\n    print('ok')\nexcept MemoryError:\n    print('MemoryError')"
    return subprocess.run([sys.executable, "-c", program], preexec_fn=cap, capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.mark.parametrize("margin_mb", [-24, 24])
def test_memory_cap_is_code_judges_room_above_a_fresh_python(sandbox_pool, margin_mb):
    room = CODE_JUDGE_ADDRESS_SPACE - fresh_python_address_space(sys.executable)
    size = room + margin_mb * MB
    expected = "ok" if margin_mb < 0 else "MemoryError"
    assert code_judge_outcome(size) == expected  # the reference: code-judge's own mechanism
    r = released(sandbox_pool, f"b = bytearray({size})\nprint('ok')")
    if expected == "ok":
        assert (r.status, r.stdout) == ("ok", "ok\n")
    else:
        assert (r.status, r.stdout, r.stderr) == ("memory", "", f"MemoryError at line 1: \n  b = bytearray({size})\n")
    # The sandbox's own semantics keep its larger cap: the same allocation runs.
    assert sandbox_pool.run(f"b = bytearray({size})\nprint('ok')").stdout == "ok\n"


def test_health_reports_the_released_memory_room(sandbox_pool):
    note = sandbox_pool.pool.health()["limits"]["released_memory"]
    assert note.startswith("released protocol:") and "384 MB" in note
