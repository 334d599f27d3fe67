"""The finding model: validation, ranking, JSON form, schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from trainmedic.findings import (
    Category,
    Finding,
    FindingsDocument,
    Severity,
    rank_findings,
    worst_severity,
)
from trainmedic.findings.schema import findings_schema


def make_finding(**overrides: object) -> Finding:
    fields: dict[str, object] = {
        "id": "thermal.margin",
        "category": Category.THERMAL,
        "severity": Severity.WARNING,
        "title": "GPU 0 runs 3 °C below its slowdown temperature",
        "evidence": {"temperature_c": 84.0, "slowdown_c": 87.0},
        "fix": "improve airflow",
        "impact": 0.1,
    }
    fields.update(overrides)
    return Finding(**fields)  # type: ignore[arg-type]


def test_impact_outside_unit_interval_is_rejected() -> None:
    with pytest.raises(ValueError, match="impact"):
        make_finding(impact=1.5)
    with pytest.raises(ValueError, match="impact"):
        make_finding(impact=-0.01)


def test_rank_puts_errors_first_then_larger_impact_then_unknown_impact() -> None:
    info = make_finding(id="a.info", severity=Severity.INFO, impact=None)
    warn_small = make_finding(id="b.small", impact=0.05)
    warn_unknown = make_finding(id="c.unknown", impact=None)
    warn_big = make_finding(id="d.big", impact=0.6)
    err = make_finding(id="e.err", severity=Severity.ERROR, impact=None)
    ranked = rank_findings([info, warn_small, warn_unknown, warn_big, err])
    assert [f.id for f in ranked] == ["e.err", "d.big", "b.small", "c.unknown", "a.info"]


def test_worst_severity() -> None:
    assert worst_severity([]) is None
    assert worst_severity([make_finding(severity=Severity.INFO)]) is Severity.INFO
    both = [make_finding(severity=Severity.INFO), make_finding(severity=Severity.ERROR)]
    assert worst_severity(both) is Severity.ERROR


def test_to_dict_has_exactly_the_required_keys_plus_set_optionals() -> None:
    d = make_finding().to_dict()
    assert list(d) == ["id", "category", "severity", "title", "evidence", "fix", "impact"]
    d2 = make_finding(subject="gpu0", detail="more").to_dict()
    assert d2["subject"] == "gpu0" and d2["detail"] == "more"


def test_document_round_trip_and_summary_counts() -> None:
    findings = [
        make_finding(id="x.one", severity=Severity.INFO, impact=None),
        make_finding(id="x.two", severity=Severity.ERROR, evidence={"ratio": float("inf")}),
    ]
    doc = FindingsDocument.build("doctor", findings, created_at=1.5, context={"gpus": ("a",)})
    data = json.loads(json.dumps(doc.to_dict()))
    assert data["schema_version"] == 1
    assert data["summary"] == {"info": 1, "warning": 0, "error": 1}
    assert [f["id"] for f in data["findings"]] == ["x.two", "x.one"]
    # Non-finite floats are not valid JSON: they become null.
    assert data["findings"][0]["evidence"]["ratio"] is None
    assert data["context"]["gpus"] == ["a"]
    back = FindingsDocument.from_dict(data)
    assert [f.id for f in back.findings] == ["x.two", "x.one"]
    assert back.findings[0].severity is Severity.ERROR


def test_document_validates_against_schema() -> None:
    doc = FindingsDocument.build("doctor", [make_finding()], created_at=0.0)
    jsonschema.validate(doc.to_dict(), findings_schema())


@pytest.mark.parametrize(
    ("key", "value"),
    [("category", "weather"), ("severity", "fatal"), ("impact", 2), ("id", "NoDots")],
)
def test_schema_rejects_bad_findings(key: str, value: object) -> None:
    data = FindingsDocument.build("doctor", [make_finding()], created_at=0.0).to_dict()
    data["findings"][0][key] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, findings_schema())


def test_schema_requires_every_finding_key() -> None:
    data = FindingsDocument.build("doctor", [make_finding()], created_at=0.0).to_dict()
    del data["findings"][0]["impact"]
    with pytest.raises(jsonschema.ValidationError, match="impact"):
        jsonschema.validate(data, findings_schema())


def test_schema_categories_match_the_enum() -> None:
    schema_categories = findings_schema()["$defs"]["finding"]["properties"]["category"]["enum"]
    assert sorted(schema_categories) == sorted(c.value for c in Category)


def test_the_apply_payload_round_trips_and_follows_the_schema() -> None:
    apply = {"dataloader": {"num_workers": 4, "pin_memory": True}}
    f = make_finding(apply=apply)
    d = json.loads(json.dumps(f.to_dict()))
    assert d["apply"] == apply
    assert Finding.from_dict(d).apply == apply
    assert "apply" not in make_finding().to_dict()  # optional: absent when nothing applies
    doc = FindingsDocument.build("run", [f], created_at=0.0).to_dict()
    jsonschema.validate(doc, findings_schema())
    doc["findings"][0]["apply"] = "num_workers=4"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, findings_schema())
