"""``--write-docs`` writes docs/performance.md from a run's tables; ``--quick`` never does."""

import pytest

from benchmarks import report, runner

HAND_WRITTEN = """# Performance

How to read the tables (hand-written, kept by every run).

## What the misses are

An explanation that no run may change.
"""


def _fake_task(name, value):
    def bench(args):
        report.print_table(f"{name} beside its baseline", ["case", "ratio"], [["x", value]])
        print("progress lines are not tables")
        return {"value": value}

    return bench


@pytest.fixture
def fake_tasks(monkeypatch, tmp_path):
    page = tmp_path / "performance.md"
    page.write_text(HAND_WRITTEN)
    monkeypatch.setattr(runner, "PERFORMANCE_PAGE", str(page))
    tasks = {"first": _fake_task("first", 1.5), "second": _fake_task("second", 0.25)}
    monkeypatch.setattr(runner, "TASKS", tasks)
    return page, tasks


def test_write_docs_adds_sections_and_keeps_the_hand_written_text(fake_tasks, monkeypatch):
    page, tasks = fake_tasks
    runner.main(["--task", "second", "--write-docs"])
    runner.main(["--task", "first", "--write-docs"])
    text = page.read_text()
    assert text.startswith(HAND_WRITTEN)  # byte for byte, above the results
    assert text.count(report.RESULTS_BEGIN) == text.count(report.RESULTS_END) == 1
    # Sections in the runner's task order, whatever order they were written in.
    assert text.index("BEGIN benchmark first") < text.index("BEGIN benchmark second")
    assert "`python tools/benchmark.py --task first --write-docs`" in text
    assert "**first beside its baseline**" in text and "| x | 1.5 |" in text
    assert "progress lines" not in text
    assert "CPUs, torch " in text  # the machine, from collect_env

    # A task run again replaces its own section only.
    monkeypatch.setitem(tasks, "first", _fake_task("first", 3.25))
    runner.main(["--task", "first", "--write-docs"])
    again = page.read_text()
    assert "| x | 3.25 |" in again and "| x | 1.5 |" not in again
    assert again.count("BEGIN benchmark first") == 1
    second = again[again.index("<!-- BEGIN benchmark second") : again.index("END benchmark second")]
    assert second in text  # untouched


def test_hand_written_text_after_the_results_is_kept(tmp_path):
    page = tmp_path / "performance.md"
    tail = "\n## Notes below the figures\n\nKept as written.\n"
    page.write_text(f"# Performance\n\n{report.RESULTS_BEGIN}\n{report.RESULTS_END}{tail}")
    section = report.task_section(
        "first", "\n### t\n\n| a |\n|---|\n| 1 |\n", command="c", date="d", seconds=1, machine="m"
    )
    report.update_performance_page(str(page), {"first": section}, order=["first"])
    text = page.read_text()
    assert text.endswith(tail)
    assert "**t**\n\n| a |\n|---|\n| 1 |" in text


def test_quick_with_write_docs_is_refused_in_one_line(fake_tasks, capsys):
    page, _ = fake_tasks
    with pytest.raises(SystemExit) as stopped:
        runner.main(["--task", "first", "--quick", "--write-docs"])
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--write-docs" in lines[0] and "--quick" in lines[0], lines
    assert "beside its baseline" not in out  # refused before any task ran
    assert page.read_text() == HAND_WRITTEN


def test_without_write_docs_nothing_is_written(fake_tasks):
    page, _ = fake_tasks
    runner.main(["--task", "first", "second"])
    assert page.read_text() == HAND_WRITTEN
