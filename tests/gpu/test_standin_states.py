"""``doctor`` and ``run`` on the hardware states real drivers produce, through the stand-in.

Each state comes from ``standin_nvml`` (nvidia-ml-py's own error classes): a
driver without the v3 process query, garbled v3 answers, a GPU lost from the
bus (GpuIsLost, ResetRequired, Unknown), queries not supported, no permission
for the process list, MIG mode. Neither command may print a traceback, and
each must name what it saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from standin_nvml import GIB, build, h100, state

from trainmedic.cli.main import main

SHIM = Path(__file__).resolve().parent / "shim"
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

MIG = {
    "mode": 1,
    "devices": [
        {"uuid": "MIG-aaaa", "gi": 1, "ci": 0, "memory_total": 40 * GIB, "memory_used": GIB},
        {"uuid": "MIG-bbbb", "gi": 2, "ci": 0, "memory_total": 40 * GIB, "memory_used": GIB},
    ],
}
STATES: dict[str, dict[str, Any]] = {
    "no v3 process query": state(h100(processes=[[os.getpid(), GIB]]), process_query="v2_only"),
    "garbled v3 answers": state(h100(processes=[[os.getpid(), GIB]]), process_query="v3_garbled"),
    "GpuIsLost": state(h100(), h100(lost="GpuIsLost", lost_at_handle=True)),
    "ResetRequired": state(h100(), h100(lost="ResetRequired")),
    "Unknown": state(h100(), h100(lost="Unknown")),
    "nothing supported": state(
        h100(
            errors={
                n: "NotSupported"
                for n in dir(build(state()))
                if n.startswith("nvmlDeviceGet") and n != "nvmlDeviceGetHandleByIndex"
            }
        )
    ),
    "no permission for processes": state(
        h100(errors={"nvmlDeviceGetComputeRunningProcesses": "NoPermission"})
    ),
    "MIG mode": state(h100(mig=MIG)),
    # What containers commonly answer: optional queries Unknown, the GPU fine.
    "container: optional queries Unknown": state(
        h100(
            errors={
                "nvmlDeviceGetTotalEccErrors": "Unknown",
                "nvmlDeviceGetRetiredPagesPendingStatus": "Unknown",
                "nvmlDeviceGetPcieThroughput": "Unknown",
                "nvmlDeviceGetRemappedRows": "NoPermission",
            }
        )
    ),
    "handle refused": state(h100(), h100(errors={"nvmlDeviceGetHandleByIndex": "NoPermission"})),
    "fabric manager down": state(h100(fabric=[1, 0]), h100(fabric=[1, 0])),
}


def doctor(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str) -> dict:
    monkeypatch.setitem(sys.modules, "pynvml", build(STATES[name]))
    code = main(["doctor", "--json", "--fail-on", "never"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    return json.loads(out)


def ids(doc: dict) -> dict[str, dict]:
    return {f"{f['id']}@{f.get('subject')}": f for f in doc["findings"]}


@pytest.mark.parametrize("name", sorted(STATES))
def test_doctor_survives_every_state(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    found = ids(doctor(monkeypatch, capsys, name))
    assert "inventory.gpu@gpu0" in found
    for f in found.values():
        assert f.get("evidence", {}).get("uuid") != "GPU-1"  # never a made-up identity


@pytest.mark.parametrize("name", ["GpuIsLost", "ResetRequired", "Unknown"])
def test_doctor_reports_a_lost_gpu_as_a_hardware_fault(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    found = ids(doctor(monkeypatch, capsys, name))
    lost = found["hardware.gpu_unreachable@gpu1"]
    assert (lost["category"], lost["severity"]) == ("hardware_fault", "error")
    assert name in lost["evidence"]["nvml_error"]
    assert "uuid" not in lost["evidence"]  # never read before it was lost: not invented
    assert found["inventory.gpu@gpu1"]["evidence"]["uuid"] is None


def test_doctor_names_mig_and_what_it_hides(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mig = ids(doctor(monkeypatch, capsys, "MIG mode"))["gpu.mig_mode@gpu0"]
    assert mig["severity"] == "info"
    assert mig["evidence"]["hidden_readings"] == ["GPU utilization", "row remapping"]
    assert [m["uuid"] for m in mig["evidence"]["mig_instances"]] == ["MIG-aaaa", "MIG-bbbb"]
    assert "GPU utilization" in mig["title"]


def test_doctor_says_when_the_process_list_is_unknown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = ids(doctor(monkeypatch, capsys, "no permission for processes"))
    unknown = found["contention.gpu.processes_unknown@gpu0"]
    assert "Permission" in unknown["evidence"]["processes_unreadable"]


def test_run_survives_lost_mig_and_mismatched_gpus(tmp_path: Path) -> None:
    """One machine, three GPUs: GPU 0 healthy, GPU 1 lost from the bus after a second
    (an Xid 79 event from NVML first), GPU 2 in MIG mode; an NVML without the v3
    process query. The sampler keeps sampling and the report names each."""
    machine = state(
        h100(),
        h100(
            uuid="GPU-1111",
            pci_bus_id="00000000:41:00.0",
            lost="GpuIsLost",
            lost_after_s=1.0,
            xids=[{"after_s": 0.8, "code": 79}],
        ),
        h100(uuid="GPU-2222", pci_bus_id="00000000:81:00.0", mig=MIG),
        process_query="v2_only",
    )
    state_file = tmp_path / "nvml.json"
    state_file.write_text(json.dumps(machine))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SHIM), os.environ.get("PYTHONPATH", "")]),
        "TRAINMEDIC_STANDIN_NVML": str(state_file),
    }
    run_dir = tmp_path / "run"
    job = [sys.executable, "-c", "import time; time.sleep(3.5)"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainmedic",
            "run",
            "--quiet",
            "--no-html",
            "--out",
            str(run_dir),
            "--",
            *job,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert "sampler_error" not in kinds, events
    xids = [e for e in events if e["kind"] == "xid"]
    assert [(e["data"]["xid"], e["data"]["gpu"]) for e in xids] == [(79, 1)]
    gpu_lines = [json.loads(line) for line in (run_dir / "gpu.jsonl").read_text().splitlines()]
    by_gpu = {i: [g for g in gpu_lines if g["i"] == i] for i in (0, 1, 2)}
    assert all(len(lines) >= 3 for lines in by_gpu.values())  # kept sampling every GPU
    assert any("un" in g for g in by_gpu[1])  # GPU 1 became unreachable
    findings = {
        f"{f['id']}@{f.get('subject')}": f
        for f in json.loads((run_dir / "findings.json").read_text())["findings"]
    }
    assert findings["hardware.gpu_unreachable@gpu1"]["severity"] in ("error", "warning")
    assert findings["hardware.gpu_unreachable@gpu1"]["evidence"]["uuid"] == "GPU-1111"
    assert findings["hardware.xid.79@gpu1"]["severity"] == "error"


@pytest.mark.parametrize("name", ["container: optional queries Unknown", "handle refused"])
def test_doctor_does_not_call_a_gpu_with_refused_readings_lost(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    found = ids(doctor(monkeypatch, capsys, name))
    assert not [k for k in found if k.startswith("hardware.gpu_unreachable")]
    refused = found["inventory.gpu@gpu0" if name.startswith("container") else "inventory.gpu@gpu1"]
    assert refused["evidence"]["unavailable_readings"]
    if name.startswith("container"):
        assert "ECC counts (Unknown)" in refused["evidence"]["unavailable_readings"]
        assert refused["evidence"]["memory_total_gib"] == 80.0


def test_doctor_names_fabric_manager_down(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = ids(doctor(monkeypatch, capsys, "fabric manager down"))
    down = found["driver.fabric_manager_not_running@host"]
    assert (down["category"], down["severity"]) == ("driver", "error")
    assert down["evidence"]["gpus"] == ["gpu0", "gpu1"]
    assert "nvidia-fabricmanager" in down["fix"] and "802" in down["title"]
