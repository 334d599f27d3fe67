"""Shares measured by sampling stacks, with how well they are known.

A share computed from stack samples (the loader's time in file reads, the
loop's time between steps spent logging, what the threads it waits on do) is
an estimate: 12 samples of 20 say 60 %, and 35-80 % would have said the same
just as often. Every rule that reports or decides on such a share takes it
from here:

* :class:`SampledShare` carries the count and a Wilson score interval (at the
  confidence of ``Thresholds.share_z``; Wilson's, because it stays inside 0..1
  and is honest at 0 or all of few samples, where the normal approximation
  claims certainty);
* :meth:`SampledShare.known` says whether there are at least
  ``Thresholds.activity_min_samples`` samples: below that no share is
  reported (:func:`share_evidence` leaves it out and says how many there were
  and how many are needed) and no category is chosen from it;
* :meth:`SampledShare.versus` compares a share with a bar: ``True`` when the
  whole interval is at or above it, ``False`` when it is below, ``None`` when
  the interval straddles it or too few samples were taken - the verdict is not
  settled, and a rule says so (at ``info``, with what would settle it) rather
  than deciding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.wilson import wilson_interval as wilson_interval  # its users import it here

SHARE_DIGITS = 4


@dataclass(frozen=True)
class SampledShare:
    """``hits`` of ``samples`` stack samples, judged with ``th``'s minimum and confidence.

    Attributes:
        hits: samples in the state (or states) counted; a float when observations
            are weighted.
        samples: samples the share is taken over.
    """

    hits: float
    samples: float
    minimum: int
    z: float

    @property
    def share(self) -> float:
        return self.hits / self.samples if self.samples > 0 else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.hits, self.samples, self.z)

    @property
    def low(self) -> float:
        return self.interval[0]

    @property
    def high(self) -> float:
        return self.interval[1]

    @property
    def known(self) -> bool:
        """At least the minimum of samples: the share may be reported and decided on."""
        return self.samples >= self.minimum

    def versus(self, bar: float, scale: float = 1.0) -> bool | None:
        """Whether ``scale x share`` is at least ``bar``: ``True``/``False`` when its whole
        interval says so, ``None`` when it straddles the bar or the share is not known."""
        if not self.known:
            return None
        if self.low * scale >= bar:
            return True
        if self.high * scale < bar:
            return False
        return None

    def scaled(self, scale: float) -> tuple[float, float, float]:
        """(share, low, high) times ``scale``: a part of step time from a share of it."""
        return self.share * scale, self.low * scale, self.high * scale


def sampled(hits: float, samples: float, th: Thresholds) -> SampledShare:
    """A share judged by ``th`` (``activity_min_samples``, ``share_z``)."""
    return SampledShare(hits, samples, th.activity_min_samples, th.share_z)


def share_of_states(
    counts: Mapping[str, float], states: str | Iterable[str], among: Iterable[str], th: Thresholds
) -> SampledShare:
    """The share of ``states`` among the samples in ``among``."""
    pool = list(among)
    wanted = [states] if isinstance(states, str) else list(states)
    total = sum(counts.get(k, 0) for k in pool)
    return sampled(sum(counts.get(k, 0) for k in wanted if k in pool), total, th)


def dominant_state(counts: Mapping[str, float], among: Iterable[str], th: Thresholds) -> str | None:
    """The state that holds ``activity_dominant_share`` of the samples in ``among`` for sure,
    with enough samples, and clearly more than any other (see :func:`dominant_of`); else
    ``None``."""
    pool = list(among)
    total = sum(counts.get(k, 0) for k in pool)
    if not pool or total < th.activity_min_samples:
        return None
    shares = {k: share_of_states(counts, k, pool, th) for k in pool}
    return dominant_of({k: (s.share, s.low, s.high) for k, s in shares.items()},
                       th.activity_dominant_share)  # fmt: skip


def dominant_of(shares: Mapping[str, tuple[float, float, float]], bar: float) -> str | None:
    """Of states with (share, low, high), the one whose interval is past ``bar`` and above
    every other state's that also reaches it: two states of 45 % each name no cause."""
    if not shares:
        return None
    top = max(shares, key=lambda k: shares[k][0])
    _, low, _ = shares[top]
    if low < bar:
        return None
    for k, (share, _, high) in shares.items():
        if k != top and share >= bar and high >= low:
            return None
    return top


def interval_evidence(s: SampledShare, scale: float = 1.0) -> list[float]:
    """``[low, high]`` of ``scale x`` the share, rounded for the evidence."""
    return [round(s.low * scale, SHARE_DIGITS), round(s.high * scale, SHARE_DIGITS)]


def share_evidence(
    prefix: str,
    counts: Mapping[str, float],
    among: Iterable[str],
    th: Thresholds,
    samples_key: str,
) -> dict[str, Any]:
    """``<prefix><state>_share`` with its ``_interval`` for each state of ``among``, and
    ``samples_key``; with fewer samples than the minimum only the count and the
    minimum (``<samples_key>_needed``): a share is never reported from a handful."""
    pool = list(among)
    total = sum(counts.get(k, 0) for k in pool)
    out: dict[str, Any] = {samples_key: total}
    if total < th.activity_min_samples:
        out[f"{samples_key}_needed"] = th.activity_min_samples
        return out
    for k in pool:
        s = share_of_states(counts, k, pool, th)
        out[f"{prefix}{k}_share"] = round(s.share, SHARE_DIGITS)
        out[f"{prefix}{k}_share_interval"] = interval_evidence(s)
    return out
