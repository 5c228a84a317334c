"""rStar2-Agent tool semantics, run for real in the bubblewrap zygote."""

from __future__ import annotations

import time

from rstar.sandbox.cell import format_error, new_namespace, run_cell


def test_print_and_exit_code(sandbox_pool):
    r = sandbox_pool.run("print('hello')")
    assert (r.status, r.exit_code, r.stdout, r.stderr) == ("ok", 0, "hello\n", "")
    assert r.ok and r.duration_s > 0


def test_stdin_is_piped(sandbox_pool):
    r = sandbox_pool.run("a = input()\nrest = __import__('sys').stdin.read()\nprint(a.upper(), rest.split())",
                         input="first\n2 3\n4\n")
    assert r.stdout == "FIRST ['2', '3', '4']\n"


def test_stdin_as_a_file_descriptor(sandbox_pool):
    r = sandbox_pool.run("import sys\nprint(sys.stdin.buffer.read().decode()[::-1])", input="abc")
    assert r.stdout == "cba\n"
    r = sandbox_pool.run("print(open(0).read().count('x'))", input="x" * 200_000)
    assert r.stdout == "200000\n"


def test_no_stdin_reads_eof(sandbox_pool):
    r = sandbox_pool.run("import sys\nprint(repr(sys.stdin.read()))")
    assert r.stdout == "''\n"


def test_last_expression_is_echoed(sandbox_pool):
    assert sandbox_pool.run("x = 6\nx * 7").stdout == "42\n"
    assert sandbox_pool.run("'text'").stdout == "'text'\n"  # repr, as IPython shows it
    assert sandbox_pool.run("print('a')\n1 + 1").stdout == "a\n2\n"


def test_no_echo_for_statements_or_none(sandbox_pool):
    assert sandbox_pool.run("x = 6").stdout == ""
    assert sandbox_pool.run("None").stdout == ""
    assert sandbox_pool.run("print('only')").stdout == "only\n"  # print returns None: not echoed again
    assert sandbox_pool.run("for i in range(2):\n    i").stdout == ""


def test_error_is_short_with_line_and_source(sandbox_pool):
    r = sandbox_pool.run("a = 1\nb = [1, 2]\nprint(b[5])\n")
    assert (r.status, r.exit_code) == ("error", 1)
    assert r.stderr == "IndexError at line 3: list index out of range\n    print(b[5])\n"


def test_error_inside_a_function_points_at_the_failing_line(sandbox_pool):
    r = sandbox_pool.run("def f(x):\n    return x / 0\n\nprint('before')\nf(1)\n")
    assert r.stdout == "before\n"
    assert r.stderr.startswith("ZeroDivisionError at line 2: division by zero\n    return x / 0")


def test_no_sandbox_frames_in_errors(sandbox_pool):
    r = sandbox_pool.run("import numpy as np\nnp.linalg.inv(np.zeros((2, 2)))")
    assert r.stderr.startswith("LinAlgError at line 2: Singular matrix")
    for leak in ("Traceback", "zygote", "cell.py", "File \"", "/opt/rstar"):
        assert leak not in r.stderr


def test_syntax_error(sandbox_pool):
    r = sandbox_pool.run("x = 1\nif x\n    print(x)\n")
    assert r.status == "error"
    assert r.stderr.startswith("SyntaxError at line 2: expected ':'\n    if x")


def test_sys_exit_codes(sandbox_pool):
    assert (sandbox_pool.run("import sys; sys.exit(0)").status, sandbox_pool.run("import sys; sys.exit()").exit_code) == ("ok", 0)
    r = sandbox_pool.run("import sys; print('x'); sys.exit(3)")
    assert (r.status, r.exit_code, r.stdout) == ("error", 3, "x\n")
    r = sandbox_pool.run("import os; os._exit(5)")
    assert (r.status, r.exit_code) == ("error", 5)


def test_output_truncated_to_1000_chars_by_default(sandbox_pool):
    r = sandbox_pool.run("import sys\nprint('a' * 5000)\nprint('b' * 3000, file=sys.stderr)")
    assert r.status == "ok"
    assert r.stdout == "a" * 1000 and r.stdout_truncated
    assert r.stderr == "b" * 1000 and r.stderr_truncated
    short = sandbox_pool.run("print('a' * 999)")
    assert short.stdout == "a" * 999 + "\n" and not short.stdout_truncated


def test_output_cap_is_configurable(sandbox_small_pool):
    r = sandbox_small_pool.run("print('é' * 80)")
    assert r.stdout == "é" * 50 and r.stdout_truncated


def test_invalid_utf8_output_is_replaced(sandbox_pool):
    r = sandbox_pool.run("import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end\\n')\nprint('\\ud800')")
    assert r.status == "ok"
    assert r.stdout.startswith("ok \ufffd\ufffd end\n")
    assert "\\ud800" in r.stdout  # a lone surrogate printed by the cell arrives escaped, not as a crash


def test_jupyter_replay_restores_state_silently(sandbox_pool):
    r = sandbox_pool.run("y * 2", tool="jupyter_code",
                         history=["x = 5\nprint('hidden output')", "import sys; print('hidden', file=sys.stderr)", "y = x + 1"])
    assert (r.status, r.stdout, r.stderr) == ("ok", "12\n", "")


def test_jupyter_replay_ignores_earlier_errors(sandbox_pool):
    r = sandbox_pool.run("print(z)", tool="jupyter_code", history=["z = 3", "1 / 0", "z = z + 1"])
    assert r.stdout == "4\n" and r.stderr == ""


def test_jupyter_line_numbers_are_the_cells_own(sandbox_pool):
    r = sandbox_pool.run("a = 1\nundefined_name", tool="jupyter_code", history=["x = 1\n" * 20])
    assert r.stderr.startswith("NameError at line 2:")


def test_stdio_tool_alias_and_statelessness(sandbox_pool):
    assert sandbox_pool.run("leftover = 1", tool="execute_python_code_with_standard_io").ok
    r = sandbox_pool.run("print(leftover)")
    assert r.status == "error" and r.stderr.startswith("NameError")


def test_session_keeps_state(sandbox_pool):
    first = sandbox_pool.run("import numpy as np\ncounter = 41", session_id="chat-a")
    assert first.ok and first.session_new is True
    second = sandbox_pool.run("counter += 1\ncounter", session_id="chat-a")
    assert (second.stdout, second.session_new) == ("42\n", False)
    other = sandbox_pool.run("counter", session_id="chat-b")
    assert other.status == "error" and "NameError" in other.stderr
    sandbox_pool.call(sandbox_pool.pool.close_session("chat-a"))
    fresh = sandbox_pool.run("'counter' in globals()", session_id="chat-a")
    assert (fresh.stdout, fresh.session_new) == ("False\n", True)
    sandbox_pool.call(sandbox_pool.pool.close_session("chat-b"))


def test_session_stdin_per_cell(sandbox_pool):
    assert sandbox_pool.run("print(input())", session_id="chat-in", input="one").stdout == "one\n"
    assert sandbox_pool.run("print(input())", session_id="chat-in", input="two").stdout == "two\n"
    sandbox_pool.call(sandbox_pool.pool.close_session("chat-in"))


def test_session_timeout_drops_the_session(sandbox_pool):
    assert sandbox_pool.run("v = 1", session_id="chat-t").ok
    assert sandbox_pool.run("while True: pass", session_id="chat-t", timeout_s=0.5).status == "timeout"
    after = sandbox_pool.run("'v' in globals()", session_id="chat-t")
    assert (after.stdout, after.session_new) == ("False\n", True)
    sandbox_pool.call(sandbox_pool.pool.close_session("chat-t"))


def test_session_expires_after_idle_ttl(sandbox_small_pool):
    assert sandbox_small_pool.run("kept = 1", session_id="idle").session_new
    assert sandbox_small_pool.run("kept", session_id="idle").stdout == "1\n"
    time.sleep(1.6)  # ttl is 1 s in this pool
    r = sandbox_small_pool.run("'kept' in globals()", session_id="idle")
    assert (r.stdout, r.session_new) == ("False\n", True)


def test_sessions_beyond_the_maximum_evict_the_idlest(sandbox_small_pool):
    for name in ("s1", "s2", "s3"):  # max_sessions is 2
        assert sandbox_small_pool.run(f"name = {name!r}", session_id=name).session_new
    assert sandbox_small_pool.run("name", session_id="s3").stdout == "'s3'\n"
    assert sandbox_small_pool.run("'name' in globals()", session_id="s1").stdout == "False\n"


def test_preloaded_libraries_are_already_imported(sandbox_pool):
    r = sandbox_pool.run("import sys\nprint(all(m in sys.modules for m in ('numpy', 'sympy', 'scipy', 'scipy.optimize', 'scipy.stats')))")
    assert r.stdout == "True\n"
    r = sandbox_pool.run("import sympy as sp\nx = sp.Symbol('x')\nsp.solve(x**2 - 4, x)")
    assert r.stdout == "[-2, 2]\n"


def test_threads_and_lazy_stdlib_imports_work(sandbox_pool):
    r = sandbox_pool.run("import threading, sqlite3, decimal\nout = []\n"
                         "t = threading.Thread(target=lambda: out.append(decimal.Decimal('1.5') * 2))\n"
                         "t.start(); t.join()\nprint(out[0], sqlite3.connect(':memory:').execute('select 7').fetchone())")
    assert r.stdout == "3.0 (7,)\n", r.stderr


def test_scratch_is_writable_and_wiped_between_calls(sandbox_pool):
    r = sandbox_pool.run("open('note.txt', 'w').write('hi')\nimport os, tempfile\n"
                         "print(open('note.txt').read(), os.path.dirname(tempfile.mkstemp()[1]) == os.getcwd())")
    assert r.stdout == "hi True\n"
    for _ in range(4):  # whichever slot runs next, it must not see the file
        assert sandbox_pool.run("import os; print(os.listdir('.'))").stdout == "[]\n"


def test_cell_helpers_in_process():
    namespace = new_namespace()
    assert run_cell("q = 2", namespace) == ("ok", 0) and namespace["q"] == 2
    try:
        exec(compile("\n\nraise KeyError('k')", "<cell>", "exec"), {})
    except KeyError as exc:
        assert format_error(exc, "\n\nraise KeyError('k')") == "KeyError at line 3: 'k'\n    raise KeyError('k')"
