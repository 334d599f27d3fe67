"""Every channel message survives its one-line JSON form."""

from __future__ import annotations

import json

import pytest

from trainmedic.channel.wire import (
    STEP_COLUMNS,
    Goodbye,
    Heartbeat,
    Hello,
    ProbeMessage,
    StepBatch,
    TorchInfo,
    decode_line,
    encode_message,
    encode_steps,
)
from trainmedic.record.types import LoaderActivity, LoaderInfo, RunEvent, StepRecord

MESSAGES: list[ProbeMessage] = [
    Hello(
        pid=10,
        ppid=9,
        role="worker",
        argv=("train.py", "--lr", "3"),
        rank=1,
        local_rank=0,
        python="3.11.7",
        executable="/usr/bin/python3",
        t=1.5,
    ),
    TorchInfo(
        pid=10,
        t=2.0,
        version="2.4.0+cu124",
        cuda_version="12.4",
        cudnn_version=90100,
        cuda_initialized=True,
        devices=("NVIDIA H100",),
        arch_list=("sm_90",),
    ),
    Heartbeat(
        pid=10,
        t=3.0,
        steps=7,
        phase="eval",
        activity="data",
        stack=("train.py:10 main",),
        cpu_s=1.25,
    ),
    Goodbye(pid=10, t=4.0, exit_code=None),
    Goodbye(pid=10, t=4.0, exit_code=0, probe_cpu_s=0.5, probe_wall_s=60.0, stack_samples=300),
    StepRecord(
        step=3,
        t=5.0,
        duration_s=0.1,
        data_wait_s=0.05,
        compute_s=0.04,
        gpu_time_s=0.03,
        samples=64,
        source="backward",
        phase="train",
        pid=10,
        rank=1,
        alloc_peak_bytes=2**33,
        reserved_peak_bytes=2**34,
        alloc_retries=0,
        ooms=0,
        autocast=True,
    ),
    LoaderInfo(
        t=6.0,
        pid=10,
        loader_id=1,
        num_workers=4,
        batch_size=32,
        pin_memory=True,
        prefetch_factor=2,
        persistent_workers=False,
        dataset_type="x.Y",
        dataset_len=100,
    ),
    LoaderActivity(t=7.0, pid=11, counts={"transform": 3, "idle": 1}, top_frames={"a.py:1 f": 3}),
    RunEvent(
        t=8.0, kind="probe_error", message="part 'cuda' disabled", pid=10, data={"part": "cuda"}
    ),
    Heartbeat(
        pid=10,
        t=3.5,
        steps=7,
        phase="train",
        activity="other",
        stack=("train.py:11 main", "train.py:40 <module>"),
        cpu_s=1.5,
        work=12,
        modules=("__main__", "__main__"),
        calls=("torch", "linalg", "eigh"),
        op="CALL",
        samples=4,
        gil_busy=1,
        probe_tid=4242,
        sampler_tid=4243,
    ),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: ProbeMessage) -> None:
    line = encode_message(message, token="secret")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    decoded, token = decode_line(line)
    assert decoded == message
    assert token == ("secret" if isinstance(message, Hello) else None)


def test_only_hello_lines_carry_the_token() -> None:
    assert b"secret" not in encode_message(MESSAGES[5], token="secret")


@pytest.mark.parametrize(
    "line",
    [
        b"[]\n",
        b'{"k": "nope"}\n',
        b'{"k": "hb", "pid": "x", "t": 1}\n',
        b"not json\n",
        b'{"t": 1}\n',
    ],
)
def test_malformed_lines_raise(line: bytes) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        decode_line(line)


def test_lines_are_compact() -> None:
    obj = json.loads(encode_message(MESSAGES[5]))
    assert obj["k"] == "step"
    assert len(encode_message(MESSAGES[5])) < 260


def _row(step: StepRecord) -> list[object]:
    return [getattr(step, c) for c in STEP_COLUMNS]


def test_a_steps_line_carries_many_steps_as_rows() -> None:
    full = MESSAGES[5]
    assert isinstance(full, StepRecord)
    bare = StepRecord(step=4, t=6.0, duration_s=0.2, pid=10, rank=1, compute_s=None)
    line = encode_steps(10, 1, [_row(full), _row(bare)])
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    decoded, token = decode_line(line)
    assert token is None
    assert decoded == StepBatch((full, bare))
    # Rows, not objects: many steps cost fewer bytes than as step lines.
    many = encode_steps(10, 1, [_row(full)] * 100)
    assert len(many) < 100 * len(encode_message(full))


def test_a_steps_line_with_t0_carries_times_in_integer_nanoseconds() -> None:
    cols = ("step", "t", "duration_s", "data_wait_s", "compute_s", "samples")
    rows: list[list[object]] = [
        [7, 0, 731_000, 117_000, None, 64],
        [8, 731_250, 731_250, 0, 5, None],
    ]
    line = encode_steps(10, None, rows, cols, t0=1_796_113_648.5)
    batch, _ = decode_line(line)
    assert isinstance(batch, StepBatch)
    first, second = batch.steps
    assert (first.step, first.samples, first.compute_s) == (7, 64, None)
    assert first.t == 1_796_113_648.5 and second.t == pytest.approx(1_796_113_648.50073125)
    assert first.duration_s == pytest.approx(0.000731, abs=1e-12)
    assert first.data_wait_s == pytest.approx(0.000117, abs=1e-12)
    assert second.compute_s == pytest.approx(5e-9) and second.samples is None
    assert (first.source, first.phase, first.pid) == ("optimizer", "train", 10)


@pytest.mark.parametrize(
    "obj",
    [
        {
            "k": "steps",
            "pid": 1,
            "cols": ["step", "t", "duration_s"],
            "t0": 5.0,
            "rows": [[1, 0, 0.5]],
        },  # seconds where nanoseconds are due
        {
            "k": "steps",
            "pid": 1,
            "cols": ["step", "t", "duration_s"],
            "t0": "5",
            "rows": [[1, 0, 5]],
        },
        {
            "k": "steps",
            "pid": 1,
            "cols": ["step", "t", "duration_s"],
            "t0": 5.0,
            "rows": [[1, None, 5]],
        },
        {"k": "steps", "pid": 1, "cols": ["step", "t"], "rows": [[1, 2.0]]},  # no duration
        {"k": "steps", "pid": 1, "cols": ["step", "t", "duration_s", "pid"], "rows": []},
        {"k": "steps", "pid": 1, "cols": ["step", "t", "duration_s", "nope"], "rows": []},
        {"k": "steps", "pid": 1, "cols": ["step", "t", "duration_s"], "rows": [[1, 2.0]]},
        {"k": "steps", "pid": 1, "cols": ["step", "t", "duration_s"], "rows": [["1", 2.0, 1]]},
        {"k": "steps", "pid": 1, "cols": ["step", "t", "duration_s"], "rows": {"a": 1}},
        {"k": "steps", "cols": ["step", "t", "duration_s"], "rows": []},
    ],
)
def test_malformed_steps_lines_raise(obj: dict[str, object]) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        decode_line(json.dumps(obj).encode() + b"\n")


def _one_by_one(
    cols: tuple[str, ...], rows: list[list[object]], t0: float | None
) -> list[StepRecord]:
    """What the batch's rows say read one step at a time through ``decode_step``."""
    from trainmedic.channel.wire import STEP_TIME_COLUMNS
    from trainmedic.record import codec

    steps = []
    for row in rows:
        values = list(row)
        if t0 is not None:
            for i, c in enumerate(cols):
                if c in STEP_TIME_COLUMNS and values[i] is not None:
                    if type(values[i]) is not int:
                        raise TypeError(values[i])
                    values[i] = values[i] / 1e9  # type: ignore[operator]
            values[cols.index("t")] += t0  # type: ignore[operator]
        named = {codec.STEP_KEYS[c]: v for c, v in zip(cols, values, strict=True) if v is not None}
        named[codec.STEP_KEYS["pid"]] = 10
        named[codec.STEP_KEYS["rank"]] = 2
        steps.append(codec.decode_step(named))
    return steps


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_reads_as_its_steps_one_by_one(seed: int) -> None:
    # Rows of good and bad values alike: the column-wise reading of a batch must give
    # the same steps, or fail where reading them one by one fails.
    import random

    rng = random.Random(seed)
    choices: dict[str, list[object]] = {
        "step": [1, 7, 2**40, None, True, 1.5, "3"],
        "t": [0, 5, 731_250, 1.25, None, "x"],
        "duration_s": [0, 731_000, 3, -5, 0.5, None, False],
        "data_wait_s": [0, 117_000, None, -1, 2.5],
        "compute_s": [None, 5, 100, -3, "a"],
        "gpu_time_s": [None, 9],
        "samples": [None, 64, 0, 2.0, False],
        "source": [None, "optimizer", "api", 3],
        "phase": [None, "train", "eval", ["x"]],
        "alloc_peak_bytes": [None, 1 << 30],
        "ooms": [None, 0, 2, "1"],
        "autocast": [None, True, False, 1],
    }
    good = {name: [v for v in values if v is None or type(v) in (int, str, bool)][:3]
            for name, values in choices.items()}  # fmt: skip
    names = [n for n in choices if n in ("step", "t", "duration_s") or rng.random() < 0.6]
    rng.shuffle(names)
    cols = tuple(names)
    t0 = rng.choice([None, 1_796_113_648.5])
    bad = rng.random() < 0.5
    rows = [
        [rng.choice(choices[c] if bad else good[c]) for c in cols] for _ in range(rng.randint(0, 6))
    ]
    line = encode_steps(10, 2, rows, cols, t0=t0)
    try:
        expected: list[StepRecord] | None = _one_by_one(cols, rows, t0)
    except (ValueError, KeyError, TypeError):
        expected = None
    if expected is None:
        with pytest.raises((ValueError, KeyError, TypeError)):
            decode_line(line)
    else:
        batch, _ = decode_line(line)
        assert isinstance(batch, StepBatch)
        assert list(batch.steps) == expected
        assert all(type(s) is StepRecord for s in batch.steps)
