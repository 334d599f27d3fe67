"""Numbers given to options: ``nan``, ``inf``, huge, negative and non-ASCII digits are one
line and exit 2 before any work (a ``nan`` passes a plain range check: no comparison
with it is true)."""

from __future__ import annotations

import pytest

from trainmedic.cli.main import main

OPTIONS = [
    ["compare", "a", "b", "--min-effect"],
    ["compare", "a", "b", "--confidence"],
    ["compare", "a", "b", "--run-noise"],
    ["doctor", "--io-budget"],
    ["tune", "dataloader", "m:f", "--budget"],
    ["tune", "dataloader", "m:f", "--step-ms"],
    ["tune", "batch-size", "m:f", "--margin"],
]


@pytest.mark.parametrize("argv", OPTIONS, ids=lambda a: " ".join(a[:1] + a[-1:]))
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400", "-1", "٣", "²"])
def test_a_number_out_of_reason_is_one_line(
    argv: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*argv, value])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") <= 3 and "Traceback" not in err and "internal error" not in err
    assert argv[-1] in err


@pytest.mark.parametrize("value", ["²", "٣٣", "9400x", "-1", "65536", "nan"])
def test_a_prometheus_port_that_is_no_number_is_one_line(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--prometheus", value, "--", "true"])
    err = capsys.readouterr().err
    assert code == 2 and "the port must be a number from 0 to 65535" in err, err


def test_an_empty_out_is_refused_not_taken_for_the_default(
    capsys: pytest.CaptureFixture[str], tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(str(tmp_path))
    code = main(["run", "--out", "", "--", "true"])
    err = capsys.readouterr().err
    assert code == 2 and "--out: empty directory name" in err


def test_tune_refuses_a_foreign_json_file_without_offering_a_force_it_lacks(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    mine = f"{tmp_path}/notes.json"
    with open(mine, "w") as f:
        f.write('{"mine": true}')
    code = main(["tune", "dataloader", "m:f", "--json", mine])
    err = capsys.readouterr().err
    assert code == 2 and "exists and is not a trainmedic JSON output" in err
    assert "--force" not in err and "choose another file name" in err
