"""The simulated GPU backend: parsing, time-series replay, and malformed files."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from trainmedic.errors import SimulationFileError
from trainmedic.gpu.backend import sample_all
from trainmedic.gpu.factory import open_backend
from trainmedic.gpu.simulated import SimulatedBackend
from trainmedic.gpu.types import (
    ClockEventReason,
    DriverInfo,
    EccCounts,
    GpuProcess,
    GpuSample,
    PcieLink,
    RemappedRows,
)

GIB = 1 << 30


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_gpu(**overrides: Any) -> dict[str, Any]:
    gpu: dict[str, Any] = {
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": "GPU-a",
        "memory_total_bytes": 80 * GIB,
        "memory_used_bytes": GIB,
    }
    gpu.update(overrides)
    return gpu


def make_doc(*gpus: dict[str, Any], **top: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "driver": {"version": "550.54.15", "cuda_version": "12.4"},
        "gpus": list(gpus) if gpus else [make_gpu()],
    }
    doc.update(top)
    return doc


def write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    return path


FULL_GPU: dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3",
    "uuid": "GPU-h",
    "memory_total_bytes": 85520809984,
    "memory_used_bytes": 536870912,
    "utilization_gpu_pct": 12.5,
    "utilization_memory_pct": 3,
    "temperature_c": 41,
    "temperature_slowdown_c": 87,
    "temperature_shutdown_c": 92,
    "power_draw_w": 120.5,
    "power_limit_w": 700,
    "sm_clock_mhz": 1755,
    "sm_clock_max_mhz": 1980,
    "clock_event_reasons": ["sw_power_cap", "sync_boost"],
    "ecc": {
        "volatile_corrected": 1,
        "volatile_uncorrected": 0,
        "aggregate_corrected": 7,
        "aggregate_uncorrected": 0,
    },
    "retired_pages_pending": False,
    "remapped_rows": {"correctable": 1, "uncorrectable": 0, "pending": False, "failure": False},
    "pcie": {
        "gen_current": 5,
        "gen_max": 5,
        "gen_gpu_max": 5,
        "width_current": 16,
        "width_max": 16,
        "tx_kib_per_s": 100,
        "rx_kib_per_s": 200,
    },
    "processes": [{"pid": 10, "used_memory_bytes": 268435456, "user": "ann", "name": "python"}],
    "persistence_mode": True,
    "compute_capability": [9, 0],
}


def test_every_field_is_read_into_the_sample() -> None:
    clock = FakeClock()
    backend = SimulatedBackend.from_dict(make_doc(FULL_GPU), source="x.json", clock=clock)
    assert backend.kind == "simulated"
    assert backend.absent_reason is None
    assert backend.driver() == DriverInfo(version="550.54.15", cuda_version=(12, 4))
    assert backend.device_count() == 1
    sample = backend.sample(0)
    expected = GpuSample(
        timestamp=sample.timestamp,
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-h",
        memory_total_bytes=85520809984,
        memory_used_bytes=536870912,
        utilization_gpu_pct=12.5,
        utilization_memory_pct=3,
        temperature_c=41,
        temperature_slowdown_c=87,
        temperature_shutdown_c=92,
        power_draw_w=120.5,
        power_limit_w=700,
        sm_clock_mhz=1755,
        sm_clock_max_mhz=1980,
        clock_event_reasons=int(ClockEventReason.SW_POWER_CAP | ClockEventReason.SYNC_BOOST),
        ecc=EccCounts(1, 0, 7, 0),
        retired_pages_pending=False,
        remapped_rows=RemappedRows(1, 0, False, False),
        pcie=PcieLink(5, 5, 5, 16, 16, 100, 200),
        processes=(GpuProcess(pid=10, used_memory_bytes=268435456, user="ann", name="python"),),
        persistence_mode=True,
        compute_capability=(9, 0),
    )
    assert sample == expected
    assert sample.memory_free_bytes == 85520809984 - 536870912


def test_omitted_readings_are_unsupported_not_zero() -> None:
    backend = SimulatedBackend.from_dict(make_doc(make_gpu()))
    sample = backend.sample(0)
    assert sample.temperature_c is None
    assert sample.clock_event_reasons is None
    assert sample.ecc == EccCounts()
    assert sample.pcie == PcieLink()
    assert sample.processes == ()


def test_reasons_as_integer_bitmask() -> None:
    backend = SimulatedBackend.from_dict(make_doc(make_gpu(clock_event_reasons=0x48)))
    assert backend.sample(0).reasons == (
        ClockEventReason.HW_SLOWDOWN | ClockEventReason.HW_THERMAL_SLOWDOWN
    )


def test_no_driver_means_no_gpus_and_a_reason() -> None:
    backend = SimulatedBackend.from_dict({"driver": None, "gpus": []}, source="none.json")
    assert backend.driver() is None
    assert backend.device_count() == 0
    assert backend.absent_reason == "no NVIDIA driver (simulated by none.json)"
    with pytest.raises(IndexError):
        backend.sample(0)


SERIES_GPU = make_gpu(
    temperature_c=60,
    sm_clock_mhz=1980,
    clock_event_reasons=[],
    pcie={"gen_current": 4, "gen_max": 4, "width_current": 16, "width_max": 16},
    series=[
        {"t": 10, "temperature_c": 80},
        {"t": 20, "temperature_c": 90, "clock_event_reasons": ["hw_slowdown"]},
        {"t": 20, "sm_clock_mhz": 990, "pcie": {"width_current": 8}},
        {"t": 35, "temperature_c": 70, "clock_event_reasons": []},
    ],
)


def test_series_replays_on_the_injected_clock() -> None:
    clock = FakeClock(500.0)
    backend = SimulatedBackend.from_dict(make_doc(SERIES_GPU), clock=clock)
    assert backend.duration_s == 35.0

    def at(elapsed: float) -> GpuSample:
        clock.now = 500.0 + elapsed
        return backend.sample(0)

    first = at(0)
    assert (first.temperature_c, first.sm_clock_mhz, first.reasons) == (60, 1980, 0)
    assert at(9.99).temperature_c == 60
    assert at(10).temperature_c == 80
    hot = at(25)
    # Entries at the same time apply in order; later ones keep earlier changes.
    assert (hot.temperature_c, hot.sm_clock_mhz) == (90, 990)
    assert hot.reasons == ClockEventReason.HW_SLOWDOWN
    # A group override changes only the fields it names.
    assert hot.pcie == PcieLink(gen_current=4, gen_max=4, width_current=8, width_max=16)
    cooled = at(100)
    assert (cooled.temperature_c, cooled.sm_clock_mhz, cooled.reasons) == (70, 990, 0)
    # Timestamps advance with the injected clock, not the machine's.
    assert cooled.timestamp - first.timestamp == pytest.approx(100.0)
    # Going back in time replays the base again: samples depend on time only.
    assert at(0) == first


def test_series_only_touches_its_own_gpu() -> None:
    clock = FakeClock()
    backend = SimulatedBackend.from_dict(
        make_doc(SERIES_GPU, make_gpu(uuid="GPU-b", temperature_c=30)), clock=clock
    )
    clock.now += 50
    assert [s.temperature_c for s in sample_all(backend)] == [70, 30]
    assert [s.index for s in sample_all(backend)] == [0, 1]


def test_open_backend_reads_a_file(tmp_path: Path) -> None:
    backend = open_backend(str(write(tmp_path, make_doc(FULL_GPU))))
    assert backend.kind == "simulated"
    assert backend.sample(0).name == "NVIDIA H100 80GB HBM3"


# ---- malformed files: every error names the file and the field -------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(SimulationFileError) as info:
        SimulatedBackend.from_file(missing)
    assert str(info.value) == f"simulation file {missing}: no such file"


def test_invalid_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    path.write_text('{\n  "driver": null,\n  "gpus": [,]\n}')
    with pytest.raises(SimulationFileError, match=r"not valid JSON \(line 3, column 12"):
        SimulatedBackend.from_file(path)


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    with pytest.raises(SimulationFileError, match="expected a JSON object at the top level"):
        SimulatedBackend.from_file(write(tmp_path, [make_gpu()]))


def mutate(path: str, value: Any) -> dict[str, Any]:
    """A valid document with the field at dotted ``path`` set (``_DELETE`` removes it)."""
    doc = make_doc(copy.deepcopy(FULL_GPU) | {"series": [{"t": 5, "temperature_c": 50}]})
    parts = path.replace("[", ".").replace("]", "").split(".")
    node: Any = doc
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last: Any = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


_DELETE: Any = object()


@pytest.mark.parametrize(
    ("path", "value", "field", "problem"),
    [
        ("driver", _DELETE, "driver", "missing"),
        ("driver", "550", "driver", "expected an object or null"),
        ("driver.version", 550, "driver.version", "expected a string"),
        ("driver.cuda_version", "12", "driver.cuda_version", "MAJOR.MINOR"),
        ("driver.cuda_version", [12, -1], "driver.cuda_version", "MAJOR.MINOR"),
        ("gpus", _DELETE, "gpus", "missing"),
        ("gpus", {"name": "x"}, "gpus", "expected a list"),
        ("driver", None, "driver", "GPUs are listed but the driver is null"),
        ("gpus[0]", "H100", "gpus[0]", "expected an object"),
        ("gpus[0].name", _DELETE, "gpus[0].name", "missing (required)"),
        ("gpus[0].memory_total_bytes", None, "gpus[0].memory_total_bytes", "missing"),
        ("gpus[0].uuid", 7, "gpus[0].uuid", "expected a string"),
        ("gpus[0].temprature_c", 50, "gpus[0].temprature_c", "unknown field"),
        ("gpus[0].temperature_c", "hot", "gpus[0].temperature_c", "expected a number, got str"),
        ("gpus[0].memory_used_bytes", 1.5, "gpus[0].memory_used_bytes", "expected an integer"),
        ("gpus[0].memory_used_bytes", True, "gpus[0].memory_used_bytes", "got a boolean"),
        ("gpus[0].power_draw_w", -1, "gpus[0].power_draw_w", "must not be negative"),
        ("gpus[0].utilization_gpu_pct", 101, "gpus[0].utilization_gpu_pct", "within 0..100"),
        ("gpus[0].persistence_mode", 1, "gpus[0].persistence_mode", "expected true or false"),
        (
            "gpus[0].memory_used_bytes",
            90 * GIB,
            "gpus[0].memory_used_bytes",
            "exceeds memory_total_bytes",
        ),
        ("gpus[0].clock_event_reasons", ["hot"], "gpus[0].clock_event_reasons[0]", "unknown"),
        ("gpus[0].clock_event_reasons", "hw_slowdown", "gpus[0].clock_event_reasons", "bitmask"),
        ("gpus[0].ecc", [], "gpus[0].ecc", "expected an object"),
        ("gpus[0].ecc.volatile", 1, "gpus[0].ecc.volatile", "unknown field"),
        ("gpus[0].pcie.width_max", "x16", "gpus[0].pcie.width_max", "expected an integer"),
        ("gpus[0].remapped_rows.pending", "no", "gpus[0].remapped_rows.pending", "true or false"),
        ("gpus[0].compute_capability", "nine", "gpus[0].compute_capability", "MAJOR.MINOR"),
        ("gpus[0].processes", {}, "gpus[0].processes", "expected a list"),
        ("gpus[0].processes[0]", 10, "gpus[0].processes[0]", "expected an object"),
        ("gpus[0].processes[0].pid", 0, "gpus[0].processes[0].pid", "positive integer"),
        ("gpus[0].processes[0].user", 1000, "gpus[0].processes[0].user", "expected a string"),
        ("gpus[0].processes[0].name", 1, "gpus[0].processes[0].name", "expected a string"),
        (
            "gpus[0].processes[0].used_memory_bytes",
            -5,
            "gpus[0].processes[0].used_memory_bytes",
            "must not be negative",
        ),
        ("gpus[0].series", {"t": 0}, "gpus[0].series", "expected a list"),
        ("gpus[0].series[0]", 5, "gpus[0].series[0]", "expected an object"),
        ("gpus[0].series[0].t", _DELETE, "gpus[0].series[0].t", "seconds >= 0"),
        ("gpus[0].series[0].t", -1, "gpus[0].series[0].t", "seconds >= 0"),
        ("gpus[0].series[0].name", "x", "gpus[0].series[0].name", "unknown or unchangeable"),
        ("gpus[0].series[0].temperature_c", "x", "gpus[0].series[0].temperature_c", "number"),
        (
            "gpus[0].series[0].memory_used_bytes",
            100 * GIB,
            "gpus[0].series[0].memory_used_bytes",
            "exceeds memory_total_bytes",
        ),
        ("gpus[0].series[0].pcie", {"lanes": 8}, "gpus[0].series[0].pcie.lanes", "unknown"),
    ],
)
def test_malformed_field_is_named(
    tmp_path: Path, path: str, value: Any, field: str, problem: str
) -> None:
    file = write(tmp_path, mutate(path, value))
    with pytest.raises(SimulationFileError) as info:
        SimulatedBackend.from_file(file)
    assert info.value.path == str(file)
    assert info.value.field == field
    assert problem in info.value.problem
    assert str(info.value).startswith(f"simulation file {file}: {field}: ")


def test_non_finite_number_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    # json.dumps would refuse NaN; Python's json.loads accepts it in a file.
    text = json.dumps(make_doc(make_gpu(temperature_c=1.0))).replace("1.0", "NaN")
    path.write_text(text)
    with pytest.raises(SimulationFileError, match=r"gpus\[0\]\.temperature_c: must be a finite"):
        SimulatedBackend.from_file(path)


def test_series_out_of_order(tmp_path: Path) -> None:
    gpu = make_gpu(series=[{"t": 10, "temperature_c": 50}, {"t": 5, "temperature_c": 60}])
    with pytest.raises(SimulationFileError) as info:
        SimulatedBackend.from_file(write(tmp_path, make_doc(gpu)))
    assert info.value.field == "gpus[0].series[1].t"
    assert "time order" in info.value.problem
