"""The one helper for bounded JSON reading: size, nesting, FIFOs, out-of-range numbers."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from trainmedic import jsonfile
from trainmedic.jsonfile import JsonLimitError


def test_a_regular_file_over_the_limit_is_refused_from_its_size(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(10 * 1024**3)  # sparse: reading it would take minutes
    start = time.monotonic()
    with pytest.raises(JsonLimitError, match="larger than 1 MiB"):
        jsonfile.read_limited(path, 1024 * 1024)
    assert time.monotonic() - start < 5


def test_a_device_is_read_only_up_to_the_limit() -> None:
    with pytest.raises(JsonLimitError, match="larger than 64 KiB"):
        jsonfile.read_limited("/dev/zero", 64 * 1024)


def test_a_directory_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        jsonfile.read_limited(tmp_path, 100)


def test_a_fifo_nobody_writes_to_fails_instead_of_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TimeoutError, match="nothing was written"):
        jsonfile.read_limited(fifo, 100, fifo_wait_s=0.1)


def test_a_fifo_with_a_writer_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(b'{"a": 1}')

    writer = threading.Thread(target=write)
    writer.start()
    assert jsonfile.read_json(fifo) == {"a": 1}
    writer.join()


@pytest.mark.parametrize("depth", [64, 65, 100_000])
def test_nesting_past_the_limit_is_refused_before_parsing(depth: int) -> None:
    text = "[" * depth + "]" * depth
    if depth <= jsonfile.MAX_DEPTH:
        assert jsonfile.loads(text) is not None
    else:
        with pytest.raises(JsonLimitError, match="nested deeper than 64"):
            jsonfile.loads(text)


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"s": "[" * 1000, "t": '\\"{' * 100})
    assert jsonfile.loads(text)["s"] == "[" * 1000


def test_out_of_range_numbers_read_as_missing() -> None:
    text = '{"a": 1e400, "b": -1e19, "c": NaN, "d": Infinity, "e": 12, "f": 0.5, "g": 1%s}' % (
        "0" * 30
    )
    assert jsonfile.loads(text, max_number=1e18) == {
        "a": None, "b": None, "c": None, "d": None, "e": 12, "f": 0.5, "g": None
    }  # fmt: skip


def test_describe_names_the_problem() -> None:
    with pytest.raises(ValueError) as bad_json:
        jsonfile.loads('{"a": }')
    assert jsonfile.describe(bad_json.value).startswith("not valid JSON (line 1, column 7")
    with pytest.raises(ValueError) as bad_bytes:
        jsonfile.loads(b"\xff")
    assert jsonfile.describe(bad_bytes.value) == "not UTF-8 text (byte 0xff at offset 0)"


@pytest.mark.parametrize(
    ("text", "deep"),
    [
        ('{"rows": [' + ",".join(["[1, 2.5, \"train\", null]"] * 500) + "]}", False),
        ('{"a": "' + "[" * 200 + '", "b": [' + "[1]," * 100 + "[2]]}", False),  # in a string
        ('{"a": "\\"[[[[", "b": ' + "[" * 63 + "]" * 63 + "}", False),  # escaped quote
        ('{"a": "\\"[[[[", "b": ' + "[" * 64 + "]" * 64 + "}", True),
        ("[" * 40 + "{}," * 100 + "{}" + "]" * 40, False),
        ("[{" * 32 + "}]" * 32, False),  # 64 levels, two kinds
        ("[{" * 32 + "[]" + "}]" * 32, True),  # 65
        ('{"x": [' + "[[]]," * 100 + "[" * 63 + "]" * 63 + "]}", True),
        ("[" * 70 + "1" + "]" * 60, True),  # unbalanced and too deep: the exact scan says so
        ("[" * 50 + "1" + "]" * 20 + ",[]" * 80, False),  # unbalanced, not too deep
    ],
)
def test_the_depth_check_counts_brackets_outside_strings_only(text: str, deep: bool) -> None:
    if deep:
        with pytest.raises(JsonLimitError, match="nested deeper than 64"):
            jsonfile.check_depth(text.encode())
    else:
        jsonfile.check_depth(text.encode())
