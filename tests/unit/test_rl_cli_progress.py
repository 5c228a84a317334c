"""Progress of long `rstar rl` commands when stderr is a log file, not a terminal (rich's bar prints nothing there)."""

from rstar.rl import cli


def test_a_log_gets_a_line_per_interval_and_the_last_step(capsys, monkeypatch):
    clock = iter([0.0, 0.0, 1.0, 40.0, 41.0])
    monkeypatch.setattr(cli.time, "monotonic", lambda: next(clock))
    progress = cli._progress()
    assert isinstance(progress, cli._LogProgress)
    with progress as bars:
        task = bars.add_task("sft", total=None, summary="")
        bars.update(task, completed=1, total=3, summary="loss 1.900")  # t=0: the first line
        bars.update(task, completed=2, total=3, summary="loss 1.500")  # t=1: too soon
        bars.update(task, completed=3, total=3, summary="loss 1.100")  # t=40: done, always logged
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["sft 1/3  loss 1.900  0s elapsed", "sft 3/3  loss 1.100  40s elapsed"]
