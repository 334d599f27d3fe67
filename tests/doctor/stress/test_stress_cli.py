"""``trainmedic doctor --stress`` on the command line: exit statuses, one-line errors,
the findings document (schema-valid), the HTML page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainmedic.cli.main import main
from trainmedic.gpu.backend import NoGpuBackend

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "simulations" / "stress"
FAULTS = str(EXAMPLES / "four-h100-faults.json")
HEALTHY = str(EXAMPLES / "healthy-h200.json")


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainmedic.gpu.factory as factory

    monkeypatch.setattr(
        factory,
        "open_nvml_or_none",
        lambda: NoGpuBackend("no NVIDIA driver: libnvidia-ml.so was not found"),
    )


def test_no_gpu_is_one_line_and_exit_3(capsys: pytest.CaptureFixture[str], no_gpu: None) -> None:
    code, out, err = run_cli(capsys, "doctor", "--stress", "--json", "-")
    assert code == 3 and out == ""
    assert err == (
        "trainmedic doctor --stress: no GPU to stress: no NVIDIA driver: "
        "libnvidia-ml.so was not found\n"
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--seconds", "nan"], "'nan' is not a finite number"),
        (["--seconds", "-5"], "-5.0 is not in the range 1.0<=x<=3600.0"),
        (["--gpus", "9"], "--gpus: no GPU 9 (this machine has no GPU)"),
        (["--gpus", "x"], "--gpus 'x': expected GPU indices such as 0,2 or 0-3"),
        (["--dcgm", "7"], "7 is not in the range 1<=x<=4"),
        (["--data-dir", "."], "--data-dir and --data-url do not apply with --stress"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], no_gpu: None, args: list[str], says: str
) -> None:
    code, out, err = run_cli(capsys, "doctor", "--stress", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and says in err and "Traceback" not in err


def test_stress_options_need_stress(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "doctor", "--gpus", "0")
    assert code == 2 and err == "trainmedic: error: --gpus applies only with --stress\n"


def test_gpus_beyond_the_simulated_machine(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "doctor", "--stress", "--simulate", FAULTS, "--gpus", "0,4")
    assert code == 2 and "no GPU 4 (this machine has GPUs 0-3)" in err


def test_faulty_machine_exits_1_and_writes_json_and_html(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import jsonschema  # type: ignore[import-untyped]

    from trainmedic.findings.schema import findings_schema

    json_path, html_path = tmp_path / "stress.json", tmp_path / "stress.html"
    code, out, err = run_cli(
        capsys,
        "doctor",
        "--stress",
        "--simulate",
        FAULTS,
        "--seconds",
        "20",
        "--json",
        str(json_path),
        "--html",
        str(html_path),
        "--dcgm",
        "1",
    )
    assert code == 1, err
    doc = json.loads(json_path.read_text())
    jsonschema.validate(doc, findings_schema())
    assert doc["summary"] == {"info": 4, "warning": 9, "error": 3}
    ctx = doc["context"]
    assert ctx["mode"] == "stress" and ctx["notes"] == [
        "dcgmi diag is not run on a simulated machine"
    ]
    g3 = ctx["stress"]["gpus"][3]
    assert g3["tflops"]["bf16"]["mean"] == pytest.approx(460.606, abs=1e-3)
    assert g3["peak_share"]["bf16"] == pytest.approx(0.4655, abs=1e-4)
    assert g3["datasheet"]["model"] == "H100 SXM5"
    # Alone (braked still) in fp8, its best dtype: 1350 x 1200 / 1980.
    assert g3["tflops_alone"]["fp8"]["mean"] == pytest.approx(818.182, abs=1e-3)
    assert g3["together_share"]["fp8"] == pytest.approx(1084.091 / 818.182, abs=1e-4)
    assert g3["readings"]["sample_period_s"] == 0.2
    page = html_path.read_text()
    assert '<meta name="generator" content="trainmedic">' in page
    assert "GPU 3 reaches 47 % of its bf16 peak while GPUs 0-2 reach 77 %" in page
    assert "resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet" in page
    assert "<script" not in page
    assert "<th>alone TFLOP/s</th>" in page and "<td>fp8 818 (together 132%)</td>" in page
    assert "<td>1980→1980 MHz (low 1200)</td>" in page  # GPU 3's clock during the bursts
    # The terminal shows the figures table and the findings.
    assert "bf16 TFLOP/s" in out and "stress.matmul_slower_than_peers" in out
    assert "alone TFLOP/s" in out and "stress.matmul_slow_alone" in out
    # An HTML page trainmedic wrote may be replaced; --fail-on never exits 0.
    code, _, _ = run_cli(
        capsys,
        "doctor",
        "--stress",
        "--simulate",
        FAULTS,
        "--seconds",
        "2",
        "--html",
        str(html_path),
        "--fail-on",
        "never",
    )
    assert code == 0


def test_healthy_machine_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "doctor", "--stress", "--simulate", HEALTHY, "--seconds", "5", "--json", "-"
    )
    assert code == 0
    assert json.loads(out)["summary"] == {"info": 2, "warning": 0, "error": 0}


def test_a_busy_gpu_exits_4_unless_forced(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = json.loads(Path(FAULTS).read_text())
    data["gpus"][0]["processes"] = [{"pid": 99999, "name": "python"}]
    busy = tmp_path / "busy.json"
    busy.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "doctor", "--stress", "--simulate", str(busy))
    assert code == 4 and out == ""
    assert err.startswith("trainmedic doctor --stress: GPU 0 is in use by pid 99999 (python)")
    assert err.count("\n") == 1
    code, _, _ = run_cli(
        capsys,
        "doctor",
        "--stress",
        "--simulate",
        str(busy),
        "--force",
        "--seconds",
        "2",
        "--json",
        "-",
    )
    assert code == 1


def test_cpu_only_torch_cannot_stress() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch can use CUDA")
    from trainmedic.doctor.stress.runner import NoGpuToStress
    from trainmedic.doctor.stress.torch_machine import open_torch_machine

    with pytest.raises(NoGpuToStress, match="cannot use CUDA"):
        open_torch_machine([])
