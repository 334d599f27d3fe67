"""The shared-memory step ring: what the probe writes is what the supervisor reads."""

from __future__ import annotations

import math
import mmap
import os
import struct

import pytest

from trainmedic.channel import ring
from trainmedic.channel.ring import NAME_SLOTS, NONE, RingError, RingReader, RingWriter

pytestmark = pytest.mark.skipif(not ring.available(), reason="no memfd_create here")
NAN = math.nan


def pair(capacity: int = 8) -> tuple[RingWriter, RingReader]:
    writer = RingWriter(capacity)
    assert writer.fd is not None
    return writer, RingReader(os.dup(writer.fd), pid=42, rank=3)


def write(writer: RingWriter, step: int, **values: float | int) -> None:
    fields = {
        "t": 1000.0 + step, "duration_s": 0.01, "data_wait_s": 0.002, "compute_s": NAN,
        "gpu_time_s": NAN, "samples": NONE, "alloc_peak": NONE, "reserved_peak": NONE,
        "retries": NONE, "ooms": NONE, "source": writer.code("optimizer"),
        "phase": writer.code("train"), "autocast": NONE,
    }  # fmt: skip
    fields.update(values)
    writer.write(step, **fields)  # type: ignore[arg-type]


def test_a_step_reads_back_with_every_field_and_its_missing_values() -> None:
    writer, reader = pair()
    write(writer, 1)
    write(
        writer, 2, compute_s=0.004, gpu_time_s=0.003, samples=64, alloc_peak=1 << 30,
        reserved_peak=2 << 30, retries=1, ooms=0, phase=writer.code("eval"), autocast=1,
    )  # fmt: skip
    first, second = reader.drain()
    assert (first.step, first.t, first.duration_s, first.data_wait_s) == (1, 1001.0, 0.01, 0.002)
    assert first.compute_s is None and first.gpu_time_s is None and first.samples is None
    assert first.alloc_peak_bytes is None and first.ooms is None and first.autocast is None
    assert (first.source, first.phase, first.pid, first.rank) == ("optimizer", "train", 42, 3)
    assert (second.compute_s, second.gpu_time_s, second.samples) == (0.004, 0.003, 64)
    assert (second.alloc_peak_bytes, second.reserved_peak_bytes) == (1 << 30, 2 << 30)
    assert (second.alloc_retries, second.ooms, second.autocast) == (1, 0, True)
    assert second.phase == "eval"
    assert reader.drain() == []  # nothing new
    write(writer, 3)
    assert [s.step for s in reader.drain()] == [3]


def test_names_beyond_the_table_are_refused() -> None:
    writer, _ = pair()
    codes = [writer.code(f"phase-{i}") for i in range(NAME_SLOTS)]
    assert codes == list(range(NAME_SLOTS))
    assert writer.code("one-more") is None
    assert writer.code("phase-5") == 5  # known names keep their code
    assert RingWriter(4).code("x" * 40) is None  # longer than a slot


def test_a_writer_that_went_round_the_ring_costs_only_the_overwritten_steps() -> None:
    writer, reader = pair(capacity=8)
    for n in range(1, 6):
        write(writer, n)
    assert len(reader.drain()) == 5
    for n in range(6, 26):  # 20 more into 8 slots: 12 are overwritten unread
        write(writer, n)
    steps = reader.drain()
    assert [s.step for s in steps] == list(range(18, 26))
    assert reader.lost == 12


def test_a_record_being_written_is_not_taken_until_it_is_whole() -> None:
    writer, reader = pair()
    write(writer, 1)
    write(writer, 2)
    # Step 2's closing stamp not yet written: as a reader sees a record mid-write.
    view = mmap.mmap(os.dup(reader_fd(writer)), 0)
    at = ring.ring_bytes(0) + 1 * ring.RECORD.size + ring.RECORD.size - 8
    view[at : at + 8] = struct.pack("<Q", 0)
    assert [s.step for s in reader.drain()] == [1]
    view[at : at + 8] = struct.pack("<Q", 2)
    assert [s.step for s in reader.drain()] == [2]


def reader_fd(writer: RingWriter) -> int:
    assert writer.fd is not None
    return writer.fd


def test_values_no_step_can_have_are_skipped_and_counted() -> None:
    writer, reader = pair()
    write(writer, 1, duration_s=NAN)
    write(writer, 2, data_wait_s=-1.0)
    write(writer, 3, compute_s=math.inf)
    write(writer, 4, source=17)  # a name never written
    write(writer, 5)
    assert [s.step for s in reader.drain()] == [5]
    assert reader.malformed == 4


def test_a_file_that_is_not_a_sealed_ring_is_refused() -> None:
    plain = os.memfd_create("plain", os.MFD_CLOEXEC)
    os.ftruncate(plain, ring.ring_bytes(8))
    with pytest.raises(RingError, match="sealed"):
        RingReader(plain, 1, None)
    writer = RingWriter(8)
    assert writer.fd is not None
    wrong = mmap.mmap(os.dup(writer.fd), 0)
    wrong[:8] = b"NOTARING"
    with pytest.raises(RingError, match="not a step ring"):
        RingReader(os.dup(writer.fd), 1, None)


def test_the_file_cannot_shrink_under_the_reader() -> None:
    writer, reader = pair()
    assert writer.fd is not None
    with pytest.raises(OSError):
        os.ftruncate(writer.fd, 16)
    write(writer, 1)
    assert len(reader.drain()) == 1
