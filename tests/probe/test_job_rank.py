"""A process's rank: torchrun's RANK, or its place in TensorFlow's TF_CONFIG cluster."""

from __future__ import annotations

import json

import pytest

from trainmedic.probe.agent import job_rank

CLUSTER = {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"], "ps": ["h3:2222"]}


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({"RANK": "3"}, 3),
        ({"RANK": "3", "TF_CONFIG": json.dumps({"task": {"type": "worker", "index": 0}})}, 3),
        ({"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "chief", "index": 0}})},
         0),
        ({"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": 1}})},
         2),
        # Without a chief, worker 0 leads (MultiWorkerMirroredStrategy's default).
        ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a", "b"]},
                                   "task": {"type": "worker", "index": 1}})}, 1),
        ({"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "ps", "index": 0}})},
         None),
        ({"TF_CONFIG": "{not json"}, None),
        ({"TF_CONFIG": json.dumps(["a list"])}, None),
        ({}, None),
    ],
)
def test_the_rank_of_a_process(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], rank: int | None
) -> None:
    for name in ("RANK", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert job_rank() == rank
