"""dcgmi diag: run without a shell when installed, its JSON (DCGM 3 and 4) read."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from trainmedic.doctor.stress.dcgm import parse_diag_json, run_dcgm_diag

DCGM3 = {
    "DCGM GPU Diagnostic": {
        "test_categories": [
            {
                "category": "Deployment",
                "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}],
            },
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "GPU Memory",
                        "results": [
                            {"gpu_ids": "0", "status": "Pass"},
                            {
                                "gpu_ids": "1",
                                "status": "Fail",
                                "warnings": [
                                    {"warning": "Memory test  found 12 errors", "error_id": 28}
                                ],
                            },
                        ],
                    }
                ],
            },
        ]
    }
}
DCGM4 = {
    "DCGM Diagnostic": {
        "test_categories": [
            {
                "category": "Integration",
                "tests": [
                    {
                        "name": "pcie",
                        "results": [
                            {
                                "entity_group": "GPU",
                                "entity_group_id": 1,
                                "entity_id": 0,
                                "status": "Warn",
                                "warnings": [{"warning": "PCIe replays 80"}],
                                "info": ["bandwidth 24 GB/s"],
                            },
                            {
                                "entity_group": "GPU",
                                "entity_group_id": 1,
                                "entity_id": 1,
                                "status": "Pass",
                            },
                        ],
                    }
                ],
            }
        ]
    }
}


def test_dcgm3_json() -> None:
    verdicts = parse_diag_json(json.dumps(DCGM3))
    assert [(v.test, v.gpu, v.status) for v in verdicts] == [
        ("Denylist", None, "Pass"),
        ("GPU Memory", 0, "Pass"),
        ("GPU Memory", 1, "Fail"),
    ]
    assert verdicts[2].failed and verdicts[2].messages == ("Memory test found 12 errors",)


def test_dcgm4_json() -> None:
    verdicts = parse_diag_json(json.dumps(DCGM4))
    assert [(v.category, v.test, v.gpu, v.status) for v in verdicts] == [
        ("Integration", "pcie", 0, "Warn"),
        ("Integration", "pcie", 1, "Pass"),
    ]
    assert verdicts[0].warned and verdicts[0].messages == ("PCIe replays 80", "bandwidth 24 GB/s")


def test_without_dcgmi_a_one_line_note_and_nothing_runs() -> None:
    ran: list[Any] = []

    def run(*args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append(args)
        raise AssertionError("dcgmi must not run")

    outcome = run_dcgm_diag(1, which=lambda _: None, run=run)
    assert not outcome.ran and ran == []
    assert outcome.note is not None and "\n" not in outcome.note
    assert outcome.note.startswith("dcgmi is not installed")


def test_dcgmi_runs_without_a_shell_with_a_limit_by_level() -> None:
    calls: list[tuple[Any, dict[str, Any]]] = []

    def run(args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append((args, kwargs))
        return subprocess.CompletedProcess(args, 226, json.dumps(DCGM3), "")

    outcome = run_dcgm_diag(2, which=lambda _: "/usr/bin/dcgmi", run=run)
    ((args, kwargs),) = calls
    assert args == ["/usr/bin/dcgmi", "diag", "-r", "2", "-j"]
    assert "shell" not in kwargs and kwargs["timeout"] == 900.0
    assert outcome.ran and len(outcome.verdicts) == 3


def test_dcgmi_failures_are_notes() -> None:
    def timeout(args: Any, **kwargs: Any) -> Any:
        raise subprocess.TimeoutExpired(args, kwargs["timeout"])

    def garbage(args: Any, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, 1, "Error: unable to connect to host engine", "")

    found = lambda _: "/usr/bin/dcgmi"  # noqa: E731
    assert run_dcgm_diag(1, found, timeout).note == "dcgmi diag -r 1 ran past 120 s"
    note = run_dcgm_diag(1, found, garbage).note
    assert note == (
        "dcgmi diag exited 1: its output is not JSON: Error: unable to connect to host engine"
    )
