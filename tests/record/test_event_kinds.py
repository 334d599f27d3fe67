"""Event kinds: one enum names them all; the codec keeps a kind it does not know."""

from __future__ import annotations

import json
import re
from pathlib import Path

import trainmedic
from trainmedic.record.codec import decode_event, encode_event
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent

DOCS = Path(__file__).resolve().parents[2] / "docs" / "run-record.md"


def test_a_kind_is_its_value_on_disk_and_in_comparisons() -> None:
    e = RunEvent(t=1.5, kind=EventKind.XID, message="Xid 79", data={"xid": 79})
    line = json.dumps(encode_event(e))
    assert json.loads(line)["kind"] == "xid" and EventKind.XID == "xid"
    back = decode_event(json.loads(line))
    assert back.kind is EventKind.XID and back == e
    assert f"{EventKind.HANG_DETECTED}" == "hang_detected"


def test_a_kind_from_another_version_is_kept_under_its_name() -> None:
    back = decode_event({"t": 2.0, "kind": "gpu_reset", "message": "reset", "data": {"gpu": 0}})
    assert back.kind is EventKind.UNKNOWN
    assert back.data == {"gpu": 0, "unknown_kind": "gpu_reset"}
    assert encode_event(back)["kind"] == "gpu_reset"  # written back as it was read


def test_every_kind_has_a_description_and_no_kind_is_spelled_out_in_the_code() -> None:
    source = (Path(trainmedic.__file__).parent / "record" / "events.py").read_text()
    for kind in EventKind:
        assert f'{kind.name} = "{kind.value}"\n    """' in source, kind
    # Emitters and readers name kinds through the enum: a literal kind= or a
    # comparison of .kind with a string would escape a rename.
    pattern = re.compile(r'\b(?:e|event)\.kind\s*(?:==|!=|in)\s*\(?\s*"|\bkind="[a-z_]+"')
    offenders = [
        str(p.relative_to(Path(trainmedic.__file__).parent))
        for p in Path(trainmedic.__file__).parent.rglob("*.py")
        if pattern.search(p.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_the_record_format_names_the_kinds_of_its_tables() -> None:
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", DOCS.read_text(), re.M))
    known = {k.value for k in EventKind}
    assert documented & known, "the event tables of docs/run-record.md"
    assert {"xid", "attempt_end", "hang_detected", "remedy_applied"} <= documented


def test_a_process_start_payload_round_trips_and_reads_wrong_types_as_absent() -> None:
    from trainmedic.record.payloads import ProcessStart, process_starts

    p = ProcessStart(
        pid=7, ppid=1, role="process", rank=3, local_rank=1, node="n1", node_rank=0,
        world_size=8, argv=("python", "train.py"), python="3.11",
    )  # fmt: skip
    e = RunEvent(t=1.0, kind=EventKind.PROCESS_START, message="", pid=7, data=p.to_data())
    assert ProcessStart.of(decode_event(json.loads(json.dumps(encode_event(e))))) == p
    odd = RunEvent(t=1.0, kind=EventKind.PROCESS_ROLE, message="", pid=7,
                   data={"rank": True, "node": 5, "role": "", "argv": "python"})  # fmt: skip
    assert ProcessStart.of(odd) == ProcessStart()  # a bool is no rank, "" no role
    other = RunEvent(t=1.0, kind=EventKind.XID, message="", data={"rank": 1})
    assert ProcessStart.of(other) is None
    assert [q for _, q in process_starts([other, e, odd])] == [p, ProcessStart()]


def test_a_hang_payload_round_trips_and_reads_wrong_fields_as_absent() -> None:
    from trainmedic.record.payloads import HangDetected
    from trainmedic.record.types import RunEvent

    hang = HangDetected(
        attempt=2, reason="no step for 31 s (bound 30 s)", basis="steps", bound_s=30.0,
        silent_s=31.25, quiet_s=12.5, extended=True, silence="blocked",
        location="train.py:42 main", directory="attempts/2", files=("stacks.txt",),
        notes=("py-spy: not installed",), forensics_s=0.75,
        evidence={"silence": "blocked", "why": "futex"}, first_stopped={"rank": 1},
    )  # fmt: skip
    event = RunEvent(t=1.0, kind=EventKind.HANG_DETECTED, message="m", data=hang.to_data())
    assert HangDetected.of(event) == hang
    bad = RunEvent(
        t=1.0, kind=EventKind.HANG_DETECTED, message="m",
        data={"attempt": "2", "bound_s": float("nan"), "silent_s": -1, "extended": "yes",
              "files": ["a", 3], "evidence": [1]},
    )  # fmt: skip
    read = HangDetected.of(bad)
    assert read is not None
    assert (read.attempt, read.bound_s, read.silent_s, read.extended) == (None, None, None, False)
    assert read.files == ("a",) and read.evidence is None
    other = RunEvent(t=1.0, kind=EventKind.JOB_START, message="m", data=hang.to_data())
    assert HangDetected.of(other) is None
