"""What ``scripts/gpu-check`` ran and how each thing ended, kept as it goes.

Standard library only, so that it reports even where trainmedic, torch or
pytest does not import. Everything goes through one JSON-lines file,
``DIR/gpu-check-results.jsonl``:

- the pytest plugin (``gpu_check_plugin``) appends a line as each test starts and
  as it ends, and one for each test file that could not be collected or was
  skipped whole;
- the script appends a line as each of its parts (preflight, nvidia-smi,
  doctor, the test sessions) starts and ends, and one when it finishes;
- each line is flushed and fsynced, then the summary ``DIR/gpu-check-summary.md``
  and the JUnit file ``DIR/gpu-check.xml`` are rendered anew from the whole
  file and replaced (temp file, fsync, rename).

So gpu-check killed at any moment leaves every result so far, and the summary
names the part and the test it was stopped in (started, never ended: KILLED).

As a script (what ``scripts/gpu-check`` calls)::

    python gpu_check_results.py part DIR NAME start BUDGET_S
    python gpu_check_results.py part DIR NAME end STATUS RC SECONDS [NOTE...]
    python gpu_check_results.py finish DIR STATUS [NOTE...]
    python gpu_check_results.py render DIR     # also prints the summary
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS_FILE = "gpu-check-results.jsonl"
SUMMARY_FILE = "gpu-check-summary.md"
JUNIT_FILE = "gpu-check.xml"

WHY_CHARS = 160  # a "why" or "note" cell of the summary

# A test's result as the summary writes it; upper case for what needs a look.
PASSED, FAILED, ERROR, TIMEOUT, SKIPPED, KILLED = (
    "passed", "FAILED", "ERROR", "TIMEOUT", "skipped", "KILLED",
)  # fmt: skip
XFAILED, XPASSED = "xfailed", "XPASSED"
NEEDS_A_LOOK = (FAILED, ERROR, TIMEOUT, KILLED, XPASSED)
# A part's status, as the script reports it: ok, skipped, FAILED or TIMEOUT.
PART_OK, PART_SKIPPED = "ok", "skipped"


def append_line(out_dir: Path, line: dict[str, Any]) -> None:
    """Append one result line (flushed and fsynced), then render the summary anew."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamped = {"t": round(time.time(), 3), **line}
    with open(out_dir / RESULTS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(stamped, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    render(out_dir)


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The results file's lines; a line cut short by a kill is left out."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for raw in text.splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


@dataclass
class PartState:
    name: str
    budget_s: float | None = None
    status: str = KILLED  # until its end line comes
    rc: int | None = None
    seconds: float | None = None
    note: str = ""


@dataclass
class TestState:
    part: str
    test: str
    result: str = KILLED  # until its end line comes
    seconds: float | None = None
    why: str = ""
    detail: str = ""


@dataclass
class Results:
    """The results file folded: the last state of each part and each test, in order."""

    parts: dict[str, PartState] = field(default_factory=dict)
    tests: dict[tuple[str, str], TestState] = field(default_factory=dict)
    finish: tuple[str, str] | None = None  # (status, note) once the script has finished

    @classmethod
    def of(cls, lines: Iterable[dict[str, Any]]) -> Results:
        res = cls()
        for line in lines:
            kind, part = line.get("kind"), str(line.get("part", "?"))
            if kind == "part":
                p = res.parts.setdefault(part, PartState(part))
                if line.get("event") == "start":
                    p.budget_s = line.get("budget_s")
                else:
                    p.status = str(line.get("status", FAILED))
                    p.rc, p.seconds = line.get("rc"), line.get("seconds")
                    p.note = str(line.get("note", ""))
            elif kind == "test":
                key = (part, str(line.get("test", "?")))
                t = res.tests.setdefault(key, TestState(*key))
                if line.get("event") == "end":
                    t.result = str(line.get("result", FAILED))
                    t.seconds = line.get("seconds")
                    t.why, t.detail = str(line.get("why", "")), str(line.get("detail", ""))
            elif kind == "finish":
                res.finish = (str(line.get("status", "")), str(line.get("note", "")))
        return res

    def counts(self, part: str) -> dict[str, int]:
        """How many tests of ``part`` had each result."""
        out: dict[str, int] = {}
        for t in self.tests.values():
            if t.part == part:
                out[t.result] = out.get(t.result, 0) + 1
        return out


def _cell(text: str, limit: int = WHY_CHARS) -> str:
    one = " ".join(str(text).split())
    if len(one) > limit:
        one = one[: limit - 1] + "…"
    return one.replace("|", "\\|")


def _secs(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else ""


def summary_markdown(res: Results) -> str:
    """The summary: each part, then each test with its result and why."""
    out = ["# gpu-check summary", ""]
    running = [p.name for p in res.parts.values() if p.status == KILLED]
    if res.finish is not None:
        out.append(f"gpu-check finished: {res.finish[0]}. {res.finish[1]}".rstrip())
    elif running:
        out.append(f"gpu-check did not finish: it was stopped during {', '.join(running)}.")
    else:
        out.append("gpu-check did not finish (or is still running).")
    out += ["", "| part | status | seconds | budget s | note |", "|---|---|---:|---:|---|"]
    for p in res.parts.values():
        note = p.note
        counts = res.counts(p.name)
        if counts:
            shown = ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
            note = f"{shown}; {note}" if note else shown
        status = "KILLED (started, never ended)" if p.status == KILLED else p.status
        took, budget = ("", "") if p.status == PART_SKIPPED else (p.seconds, p.budget_s)
        out.append(f"| {p.name} | {status} | {_secs(took)} | {_secs(budget)} | {_cell(note)} |")
    if res.tests:
        out += [
            "",
            "## Tests: passed (proven on this machine), failed, skipped, and why",
            "",
            "| part | test | result | seconds | why |",
            "|---|---|---|---:|---|",
        ]
        for t in res.tests.values():
            why = t.why
            if t.result == KILLED:
                why = "started, never ended: its session was stopped here"
            out.append(
                f"| {t.part} | {_cell(t.test, 200)} | {t.result} | {_secs(t.seconds)} | "
                f"{_cell(why)} |"
            )
    return "\n".join(out) + "\n"


def junit_xml(res: Results) -> str:
    """JUnit XML: one suite for the script's parts, one per test session."""
    root = ET.Element("testsuites", name="gpu-check")

    def case(suite: ET.Element, classname: str, name: str, t: TestState) -> None:
        el = ET.SubElement(
            suite, "testcase", classname=classname, name=name, time=_secs(t.seconds) or "0"
        )
        message = t.why or t.result
        if t.result in (FAILED, TIMEOUT, KILLED, XPASSED):
            ET.SubElement(el, "failure", message=message).text = t.detail or message
        elif t.result == ERROR:
            ET.SubElement(el, "error", message=message).text = t.detail or message
        elif t.result in (SKIPPED, XFAILED):
            ET.SubElement(el, "skipped", message=t.why)

    def counted(suite: ET.Element) -> None:
        cases = list(suite)
        suite.set("tests", str(len(cases)))
        for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            suite.set(attr, str(sum(1 for c in cases if c.find(tag) is not None)))

    parts = ET.SubElement(root, "testsuite", name="gpu-check.parts")
    for p in res.parts.values():
        result = {PART_OK: PASSED, PART_SKIPPED: SKIPPED, KILLED: KILLED}.get(p.status, FAILED)
        case(parts, "gpu-check", p.name, TestState(p.name, p.name, result, p.seconds, p.note))
    counted(parts)
    suites: dict[str, ET.Element] = {}
    for t in res.tests.values():
        if t.part not in suites:
            suites[t.part] = ET.SubElement(root, "testsuite", name=t.part)
        path, _, name = t.test.partition("::")
        case(suites[t.part], path.removesuffix(".py").replace("/", "."), name or path, t)
    for suite in suites.values():
        counted(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _replace(path: Path, text: str) -> None:
    # Not trainmedic.atomicfile: this module must work where trainmedic does not import.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep it from whoever collects $OUT
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def render(out_dir: Path) -> Results:
    """Render the summary and the JUnit file from the results file; returns the results."""
    res = Results.of(read_lines(out_dir / RESULTS_FILE))
    _replace(out_dir / SUMMARY_FILE, summary_markdown(res))
    _replace(out_dir / JUNIT_FILE, junit_xml(res))
    return res


def main(argv: list[str]) -> int:
    """The script's side: a part's start or end, the finish, a render."""
    cmd = argv[:1]
    if cmd == ["part"] and len(argv) == 5 and argv[3] == "start":
        line: dict[str, Any] = {"budget_s": float(argv[4])}
    elif cmd == ["part"] and len(argv) >= 7 and argv[3] == "end":
        line = {"status": argv[4], "rc": int(argv[5]), "seconds": float(argv[6]),
                "note": " ".join(argv[7:])}  # fmt: skip
    elif cmd == ["finish"] and len(argv) >= 3:
        finish = {"kind": "finish", "status": argv[2], "note": " ".join(argv[3:])}
        append_line(Path(argv[1]), finish)
        return 0
    elif cmd == ["render"] and len(argv) == 2:
        sys.stdout.write(summary_markdown(render(Path(argv[1]))))
        return 0
    else:
        sys.stderr.write("usage:" + (__doc__ or "").split("::", 1)[1])
        return 2
    append_line(Path(argv[1]), {"kind": "part", "event": argv[3], "part": argv[2], **line})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
