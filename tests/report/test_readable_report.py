"""A report a person reads in ten seconds: each finding's few facts in words with units,
its fix with this run's directory and command filled in, where a step's time goes as a
bar at the top - in the terminal at 80 and 120 columns, without colour, and in HTML."""

from __future__ import annotations

import dataclasses
import io
import re
import shlex
from pathlib import Path

from rich.console import Console

from support import builders
from support.readable import assert_readable, evidence_blocks, render
from trainmedic.findings.fixes import TUNE_LOADER_FIX
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.stats import summarize
from trainmedic.report.breakdown import bar_text, legend_lines, of_summary
from trainmedic.report.facts import facts, format_value
from trainmedic.report.fix_text import Known, fill
from trainmedic.report.html import render_html_report
from trainmedic.report.ranks import ranks_of_record
from trainmedic.report.run_summary import render_run_summary

# The evidence of the demo's input finding as the rule writes it: 33 values.
DEMO_EVIDENCE = {
    "data_wait_share": 0.588, "data_wait_exposed_share": 0.588, "data_wait_warning_share": 0.2,
    "data_wait_error_share": 0.5, "step_time_median_s": 0.0412, "steady_steps": 180,
    "usable_cores": 2.0, "job_cpu_cores": 1.02, "others_cpu_cores": 0.004, "spare_cores": 0.98,
    "job_useful_cpu_cores": 0.97, "train_cpu_wait_share": 0.01, "loading_cpu_wait_share": 0.02,
    "predicted_speedup": 1.7, "predicted_step_s": 0.024, "speedup_limited_by": "compute",
    "samples_per_s_needed": 1550.0, "num_workers": 0, "recommended_num_workers": 1,
    "recommended_threads_per_worker": 1, "loader_stack_samples": 61,
    "loader_transform_share": 1.0, "loader_transform_share_interval": [0.957, 1.0],
    "loader_file_read_share": 0.0, "loader_file_read_share_interval": [0.0, 0.043],
    "loader_socket_wait_share": 0.0, "loader_socket_wait_share_interval": [0.0, 0.043],
    "loader_other_share": 0.0, "loader_other_share_interval": [0.0, 0.043],
    "loading_cores_needed": 0.6, "iowait_pct": 0.4, "disk_read_mib_per_s": 0.000324,
    "net_recv_mib_per_s": 0.0,
}  # fmt: skip


def demo_finding() -> Finding:
    return Finding(
        "input.workers", Category.FRAMEWORK_CONFIG, Severity.ERROR,
        "The training process prepares every batch itself: 59% of step time", DEMO_EVIDENCE,
        "Set DataLoader(num_workers=1). " + TUNE_LOADER_FIX, impact=0.588,
    )  # fmt: skip


def test_values_read_in_their_units() -> None:
    assert format_value("disk_read_mib_per_s", 0.000324) == "<0.01 MiB/s"
    assert format_value("net_recv_mib_per_s", 0.0) == "0 MiB/s"
    assert format_value("step_time_median_s", 0.0412) == "41.2 ms"
    assert format_value("step_time_median_s", 0.000176) == "176 µs"
    assert format_value("longest_step_s", 300.0) == "5m 00s"
    assert format_value("data_wait_share", 0.588) == "59%"
    assert format_value("x_share", 0.001) == "<1%"
    assert format_value("x_share", 0.997) == ">99%"
    assert format_value("iowait_pct", 0.4) == "<1%"
    assert format_value("requested_bytes", 12884901888) == "12 GiB"
    assert format_value("job_cpu_cores", 1.0) == "1 core"
    assert format_value("others_cpu_cores", 0.004) == "<0.01 cores"
    assert format_value("predicted_speedup", 1.7) == "1.7x"
    assert format_value("latency_bound", False) == "no"
    assert format_value("steps", 12345) == "12,345"
    assert format_value("top_frames", ["a", "b", "c", "d", "e"]) == "a; b; c (+2 more)"


def test_the_demo_finding_says_its_case_in_four_facts() -> None:
    said = facts("input.workers", DEMO_EVIDENCE)
    assert said == [
        "waiting for the next batch: 59% of step time (warning from 20%, error from 50%)",
        "the job used 1 of 2 usable cores; other processes <0.01 cores; 0.98 cores idle",
        "the loading time (61 samples): dataset code 100% (96%-100%)",
        "expected with the fix: 1.7x the speed",
    ]
    # The same wait twice (exposed = all of it) is said once; nothing in raw key=value form.
    text = " ".join(facts("input.workers", DEMO_EVIDENCE, limit=40))
    assert text.count("59%") == 1 and "=" not in text and "0.000324" not in text
    assert "warning_share" not in text and "interval" not in text


def test_a_split_seen_in_the_rules_order_is_one_line_and_bookkeeping_is_left_out() -> None:
    ev = {
        "mystery_share": 0.42, "outside_stack_samples": 12, "outside_min_samples": 20,
        "outside_python_share": 0.75, "outside_python_share_interval": [0.5, 0.9],
        "outside_sleep_share": 0.25, "outside_sleep_share_interval": [0.1, 0.5],
        "outside_log_share": 0.0, "outside_log_share_interval": [0.0, 0.2],
        "settled": False, "helper_observations_needed": 20, "odd_rate_mhz": 1410.0,
    }  # fmt: skip
    assert facts("some.new_rule", ev) == [
        "mystery: 42%",
        "the time between steps (12 samples): Python 75% (50%-90%), sleeping 25%",
        "odd rate: 1,410 MHz",
    ]


def test_fixes_get_this_runs_directory_and_command_quoted_to_paste(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "my run"
    command = ["python", "train.py", "--name", "it's mine", "--lr=3e-4"]
    known = Known(run_dir=run_dir, command=command)
    filled = fill(TUNE_LOADER_FIX, known)
    assert "RUN_DIR" not in filled and "CMD" not in filled
    pasted = filled.split("trainmedic run ", 1)[1].rstrip(".")
    assert shlex.split(pasted) == ["--apply-from", str(run_dir), "--", *command]
    # What trainmedic cannot know stays for the user: their module, a finished run's pid.
    assert "MODULE:FACTORY" in filled
    assert fill("py-spy dump --pid PID", known) == "py-spy dump --pid PID"
    assert fill("py-spy dump --pid PID", Known(pid=4321)) == "py-spy dump --pid 4321"
    assert fill("a PIDDLE of RUN_DIRT", known) == "a PIDDLE of RUN_DIRT"


def test_the_terminal_finding_keeps_to_six_lines_of_evidence_at_80_and_120_columns(
    tmp_path: Path,
) -> None:
    known = Known(run_dir=tmp_path / "run", command=["python", "train.py"],
                  evidence_at=str(tmp_path / "run" / "findings.json"))  # fmt: skip
    long = dict(DEMO_EVIDENCE, top_frames=["x" * 300, "y" * 300])
    wordy = Finding("host.python", Category.CPU, Severity.WARNING, "t", long, "fix RUN_DIR")
    for width in (80, 120):
        text = render([demo_finding(), wordy], known, width)
        assert_readable(text, width)
        blocks = evidence_blocks(text)
        assert len(blocks) == 2 and all(2 <= len(b) <= 6 for b in blocks), blocks
        # A path folds across lines whole, never cut: read without the folds.
        flat = "".join(text.split())
        assert f"all33values:{tmp_path / 'run' / 'findings.json'}" in flat
        assert f"--apply-from{tmp_path / 'run'}--pythontrain.py" in flat


def test_the_summary_opens_with_where_a_steps_time_goes(tmp_path: Path) -> None:
    steps = builders.make_steps(60, duration=0.04, wait=0.02, compute=0.015)
    record = builders.make_record(steps, loaders=[builders.make_loader()])
    summary = summarize(record)
    job = of_summary(summary)
    assert job is not None
    assert [(p.key, round(p.share, 3)) for p in job.parts] == [
        ("data", 0.5), ("compute", 0.375), ("other", 0.125)
    ]  # fmt: skip
    for width in (80, 120):
        out = io.StringIO()
        console = Console(file=out, width=width, no_color=True, highlight=False)
        render_run_summary(console, record.meta, summary, (), True)
        text = out.getvalue()
        lines = text.splitlines()
        bar = next(i for i, line in enumerate(lines) if "a step's time" in line)
        assert bar < next(i for i, line in enumerate(lines) if line.lstrip().startswith("steps"))
        # Without colour each part still reads: its own character, in proportion.
        cells = re.search(r"[▒█░▓]+", lines[bar])
        assert cells is not None and len(cells.group()) == 40
        assert cells.group().count("▒") == 20 and cells.group().count("█") == 15
        legend = " ".join(lines[bar + 1 : bar + 4])
        for key in ("▒ waiting for data 50%", "█ forward/backward/optimizer 38%",
                    "░ other host work 12%"):  # fmt: skip
            assert key in legend, legend
        assert all(len(line.rstrip()) <= width for line in lines)


def test_a_tiny_part_keeps_a_cell_and_a_loop_without_loader_names_its_own_time() -> None:
    steps = builders.make_steps(60, duration=0.1, wait=0.0015, compute=0.0985)
    job = of_summary(summarize(builders.make_record(steps)), loader=False)
    assert job is not None and job.parts[0].name == "between steps"
    assert bar_text(job, 40).plain.count("▒") == 1
    keys = [line.plain for line in legend_lines(job, 30)]
    assert keys == ["▒ between steps 2%", "█ forward/backward/optimizer 98%"]


def test_the_html_first_screen_is_the_bar_and_the_findings_with_filled_fixes(
    tmp_path: Path,
) -> None:
    steps = builders.make_steps(60, duration=0.04, wait=0.02, compute=0.015)
    record = builders.make_record(steps, loaders=[builders.make_loader()])
    known = Known(run_dir=tmp_path / "r", command=record.meta.command)
    page = render_html_report(record, [demo_finding()], known)
    body = page.split("<body", 1)[1]
    order = [body.index(x) for x in ('class="breakdown"', 'id="findings"', 'id="run"',
                                     'id="summary"', 'id="plots"')]  # fmt: skip
    assert order == sorted(order)
    finding = body[body.index('class="finding'):]
    assert "<li>waiting for the next batch: 59% of step time" in finding
    assert f"--apply-from {tmp_path / 'r'} -- python train.py" in finding
    assert "<details><summary>all 33 evidence values</summary>" in finding
    assert "&lt;0.01 MiB/s" in finding  # the full table reads in units too


def test_a_distributed_run_has_a_bar_per_rank_and_the_waiting_rank_shows() -> None:
    fast = builders.make_steps(60, duration=0.05, wait=0.005, compute=0.04, pid=11, rank=0)
    slow = builders.make_steps(60, duration=0.05, wait=0.03, compute=0.015, pid=12, rank=1)
    record = builders.make_record([*fast, *slow], loaders=[builders.make_loader()])
    out = io.StringIO()
    console = Console(file=out, width=80, no_color=True, highlight=False)
    render_run_summary(console, record.meta, summarize(record), ranks_of_record(record), True)
    text = out.getvalue()
    assert "rank 0" in text and "rank 1" in text
    rank1 = text[text.index("rank 1") :]
    assert "▒ waiting for data 60%" in rank1 and "█ forward/backward/optimizer 30%" in rank1
    rank0 = text[text.index("rank 0") : text.index("rank 1")]
    assert "▒ waiting for data 10%" in rank0
    page = render_html_report(record, [])
    assert page.count('class="breakdown"') == 3  # the job, rank 0, rank 1


def test_escape_codes_from_a_record_never_reach_the_terminal(tmp_path: Path) -> None:
    steps = builders.make_steps(30, duration=0.04, wait=0.02, compute=0.015)
    record = builders.make_record(steps)
    record.meta = dataclasses.replace(
        record.meta, command=("python", "train.py", "--tag", "\x1b]0;pwned\x07\x1b[2J")
    )
    hostile = Finding("input.x\x1b[31m", Category.IO, Severity.WARNING, "slow\x1b[2J\x9b1m",
                      {"note": "\x1b[5mblink"}, "fix \x1b[8m RUN_DIR")  # fmt: skip
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, highlight=False)
    render_run_summary(console, record.meta, summarize(record))
    text = out.getvalue() + render([hostile], Known(run_dir=tmp_path), 120)
    for raw in ("\x1b]0;", "\x07", "\x1b[2J", "\x9b", "\x1b[5m", "\x1b[8m", "\x1b[31m"):
        assert raw not in text, repr(raw)
    assert "\\x1b]0;pwned\\x07" in text and "slow\\x1b[2J" in text


def test_a_category_heading_says_what_it_covers() -> None:
    """``[timeout]`` over a crash reads as a mistake unless it says hangs and crashes."""
    crash = Finding(
        "failure.segfault", Category.TIMEOUT, Severity.ERROR, "The job crashed in native code",
        {"exit_code": -11}, "Run with PYTHONFAULTHANDLER=1.",
    )  # fmt: skip
    text = render([crash, demo_finding()], None, 80)
    headings = [line for line in text.splitlines() if line.startswith("[")]
    assert sorted(headings) == [
        "[framework_config] the framework set up badly",
        "[timeout] hangs, crashes and restarts",
    ]
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines())
