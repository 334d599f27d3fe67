"""Fuzzing the values a user types: every option of run, doctor and report, resume templates,
data URLs and paths. Each ends in success or one line naming what is wrong."""

from __future__ import annotations

import os
import string
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from trainmedic.errors import InputError, RunDirectoryError, UsageError
from trainmedic.host.nettarget import parse_target
from trainmedic.ostext import printable
from trainmedic.supervise.loop.resume import ResumePoint, parse_resume_template, resume_arguments
from trainmedic.supervise.rundir import check_run_dir

from .fuzzing import FUZZ, assert_clean, run_cli

# Values the way a hostile user types them: numbers of every odd kind, paths,
# empty strings, bytes that are not UTF-8 (as Python hands them over).
VALUES = st.one_of(
    st.sampled_from(
        ["", "0", "-1", "1e309", "nan", "inf", "-inf", "1" * 5000, "0x10", "1_000", " 5",
         "/", "/dev/zero", "/dev/null", ".", "..", "a" * 300, "~nouser/x", "-", "--", "\udcff",
         "{checkpoint", "{step!r}", "}{", "never", "error", "info", "٣", "²", "１", "0.5",
         "1e-300", "NaN", "+inf"]
    ),
    st.text(max_size=20),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers().map(str),
)  # fmt: skip
RUN_OPTIONS = [
    "--out", "--simulate", "--fail-on", "--max-restarts", "--timeout", "--startup-timeout",
    "--timeout-floor", "--time-budget", "--grace", "--backoff", "--resume-args",
    "--checkpoint-glob",
]  # fmt: skip
RUN_FLAGS = ["--quiet", "-q", "--no-html", "--no-probe", "--retry-on-exception"]
MISSING = "/nonexistent-trainmedic-fuzz/cmd"


@FUZZ
@given(
    options=st.lists(st.tuples(st.sampled_from(RUN_OPTIONS), VALUES), max_size=4),
    flags=st.lists(st.sampled_from(RUN_FLAGS), max_size=2),
    unknown=st.one_of(st.none(), st.text(alphabet=string.ascii_letters + "-", max_size=10)),
)
def test_fuzz_run_options(
    tmp_path: Path, options: list[tuple[str, str]], flags: list[str], unknown: str | None
) -> None:
    args = ["run", *flags]
    for name, value in options:
        args += [name, value]
    if unknown:
        args.append("--" + unknown.lstrip("-"))
    before = sorted(os.listdir(tmp_path))
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a default run directory would land here
    try:
        code, _, err = run_cli([*args, "--", MISSING])
    finally:
        os.chdir(cwd)
    # The command does not exist: whatever the options, nothing runs and nothing is made.
    assert code in (2, 127), (code, err)
    assert_clean(code, err, ok=())
    assert sorted(os.listdir(tmp_path)) == before


@FUZZ
@given(
    url=st.one_of(VALUES, st.builds(lambda h, p: f"http://{h}:{p}", VALUES, VALUES)),
    budget=VALUES,
    fail_on=VALUES,
    json_out=VALUES,
)
def test_fuzz_doctor_options(url: str, budget: str, fail_on: str, json_out: str) -> None:
    # A simulation that does not exist: every value is checked before it is looked for.
    args = ["doctor", "--data-url", url, "--io-budget", budget, "--fail-on", fail_on]
    args += ["--json", json_out, "--simulate", MISSING]
    code, _, err = run_cli(args)
    assert code == 2
    assert_clean(code, err, ok=())


@FUZZ
@given(run_dir=VALUES, out=VALUES)
def test_fuzz_report_paths(run_dir: str, out: str) -> None:
    code, _, err = run_cli(["report", run_dir, "--html", out])
    assert_clean(code, err, ok=())


@FUZZ
@given(target=VALUES)
def test_fuzz_data_urls(target: str) -> None:
    try:
        scheme, host, port, _ = parse_target(target)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert scheme in ("http", "https", "tcp") and host and 1 <= port <= 65535


BRACES = st.text(alphabet="{}!:checkpointstep -='\"\\", max_size=30)


@FUZZ
@given(template=st.one_of(BRACES, VALUES), step=st.one_of(st.none(), st.integers(0, 10**9)))
def test_fuzz_resume_templates(template: str, step: int | None) -> None:
    try:
        parsed = parse_resume_template(template)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    args = resume_arguments(parsed, ResumePoint(Path("/ck/p.pt"), step, "glob"))
    assert len(args) == len(parsed)
    for raw, filled in zip(parsed, args, strict=True):
        if "{" not in raw and "}" not in raw:
            assert filled == raw


@FUZZ
@given(path=VALUES)
def test_fuzz_run_directory_paths(tmp_path: Path, path: str) -> None:
    try:
        check_run_dir(tmp_path / path if path else Path(path))
    except RunDirectoryError as exc:
        assert "\n" not in str(exc)
        printable(str(exc)).encode("utf-8")  # shows without an encoding error


@FUZZ
@given(min_effect=VALUES, confidence=VALUES, noise=VALUES, budget=VALUES, step=VALUES,
       port=VALUES)  # fmt: skip
def test_fuzz_numeric_options(
    min_effect: str, confidence: str, noise: str, budget: str, step: str, port: str
) -> None:
    # Runs and outputs that do not exist: every number is judged before they are looked for.
    compare = ["compare", MISSING, MISSING, "--min-effect", min_effect, "--confidence",
               confidence, "--run-noise", noise]  # fmt: skip
    tune = ["tune", "dataloader", "m:f", "--budget", budget, "--step-ms", step, "--json",
            "/nonexistent-trainmedic-fuzz/x.json"]  # fmt: skip
    prometheus = ["run", "--prometheus", port, "--", MISSING]
    for args in (compare, tune, prometheus):
        code, _, err = run_cli(args)
        assert code in (2, 127), (args, code, err)
        assert_clean(code, err, ok=())
