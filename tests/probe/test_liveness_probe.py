"""What the heartbeat says about a thread: its place, and whether Python runs."""

from __future__ import annotations

import threading
import time

from trainmedic.probe.liveness import ThreadSamples, describe_frame, main_frame
from trainmedic.resilience.places import Place, PlaceKind, classify_place

SAMPLES = 20


def place_of(ident: int | None) -> Place:
    frames, modules, calls, op = describe_frame(main_frame(ident), 6, lambda name: name)
    return Place(frames, modules, calls, op)


def run_in_thread(target, ready: threading.Event) -> threading.Thread:  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    assert ready.wait(5)
    time.sleep(0.05)
    return thread


def test_a_sleeping_thread_is_parked_at_its_call_and_holds_no_lock() -> None:
    ready, stop = threading.Event(), threading.Event()

    def sleeper() -> None:
        ready.set()
        while not stop.is_set():
            time.sleep(0.5)

    thread = run_in_thread(sleeper, ready)
    place = place_of(thread.ident)
    assert place.calls == ("time", "sleep") and place.op == "CALL"
    assert place.modules[0] == __name__
    assert place.frames[0].endswith(" sleeper")
    assert classify_place(place) is PlaceKind.SLEEP
    samples = ThreadSamples()
    for _ in range(SAMPLES):
        samples.sample()
    counted, busy = samples.take()
    # The lock was free (a loaded machine may delay a sample now and then).
    assert counted == SAMPLES and busy <= SAMPLES // 4
    assert samples.take() == (0, 0)
    stop.set()


def test_a_spinning_thread_holds_the_interpreter_lock() -> None:
    ready, stop = threading.Event(), threading.Event()

    def spinner() -> None:
        ready.set()
        x = 0
        while not stop.is_set():
            x += 1

    run_in_thread(spinner, ready)
    samples = ThreadSamples()
    # A sample waits for the loop to let go of the lock whenever the loop's thread is on a
    # core. On a loaded machine the OS may not run it at the moment the sampler lets go,
    # and that sample finds the lock free: so count up to a bound, not a share of a
    # fixed number (the sleeping thread's test above bounds the other side).
    for _ in range(10 * SAMPLES):
        samples.sample()
        if samples.gil_busy >= SAMPLES // 2:
            break
    counted, busy = samples.take()
    stop.set()
    assert busy >= SAMPLES // 2, (counted, busy)


def test_no_frame_describes_nothing() -> None:
    assert describe_frame(None, 6, str) == ((), (), (), "")


def test_top_up_samples_only_what_is_missing() -> None:
    samples = ThreadSamples()
    samples.sample()
    samples.top_up(3)
    assert samples.samples == 3
    samples.top_up(2)
    assert samples.take()[0] == 3
    samples.top_up(0)
    assert samples.take() == (0, 0)
