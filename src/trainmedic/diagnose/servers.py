"""A data server on this machine, as the probe saw it while the job waited on its sockets.

The probe looks at the process at the far end of a socket that a helper thread,
the training thread or a DataLoader worker waits on (:mod:`trainmedic.host.peers`,
:mod:`trainmedic.probe.handoff`): each look is one of
:data:`~trainmedic.host.peers.ACTIVITIES` (its threads on a CPU, in a disk,
asleep), with the threads it had on a CPU. :class:`ServerLooks` sums them over
the run; what they settle (at least ``activity_min_samples`` looks, one activity
holding ``activity_dominant_share`` of them for sure) decides what a wait on the
network is made of.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainmedic.diagnose.sampled import SampledShare, sampled
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.host.peers import ACTIVITIES
from trainmedic.record.sample_states import PEER_PREFIX, SERVER_PREFIX, SERVER_RUNNING


@dataclass(frozen=True)
class ServerLooks:
    """Looks at the servers the job waited on.

    Attributes:
        activities: looks by activity.
        running: their threads seen on a CPU, summed over the looks.
        peers: the servers (``<pid> <command line>``) and their looks.
    """

    activities: Counter[str] = field(default_factory=Counter)
    running: int = 0
    peers: Counter[str] = field(default_factory=Counter)

    @property
    def observations(self) -> int:
        return sum(self.activities.values())

    def share(self, activity: str, th: Thresholds) -> SampledShare:
        """Share of the looks in ``activity``."""
        return sampled(self.activities[activity], self.observations, th)

    def activity(self, th: Thresholds) -> str | None:
        """What the server does, when the looks settle it."""
        if self.observations < th.activity_min_samples:
            return None
        top = max(ACTIVITIES, key=lambda a: self.activities[a])
        return top if self.share(top, th).versus(th.activity_dominant_share) else None

    @property
    def cores(self) -> float:
        """Its threads on a CPU while the job waited on it, on average."""
        n = self.observations
        return self.running / n if n else 0.0

    @property
    def name(self) -> str | None:
        """The server looked at most: ``<pid> <command line>``."""
        return self.peers.most_common(1)[0][0] if self.peers else None

    def add(self, handoff: Mapping[str, int]) -> ServerLooks:
        """These looks and those of one record's ``handoff`` counts."""
        activities, peers = Counter(self.activities), Counter(self.peers)
        for key, n in handoff.items():
            if key.startswith(SERVER_PREFIX):
                activities[key[len(SERVER_PREFIX) :]] += n
            elif key.startswith(PEER_PREFIX):
                peers[key[len(PEER_PREFIX) :]] += n
        return ServerLooks(activities, self.running + handoff.get(SERVER_RUNNING, 0), peers)


def measure_servers(view: RunView, pids: frozenset[int] | None = None) -> ServerLooks:
    """The run's looks at data servers, from the processes ``pids`` (default: all)."""
    looks = ServerLooks()
    for a in view.record.loader_activity:
        if a.handoff and (pids is None or a.pid in pids):
            looks = looks.add(a.handoff)
    return looks
