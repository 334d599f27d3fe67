"""The names a stack-sampled activity is counted under: the record's vocabulary.

The probe's samplers count their samples under these names
(:class:`~trainmedic.record.types.LoaderActivity` ``counts`` and ``handoff``) and
the diagnosis reads them back; both take them from here, so neither reaches
into the other.
"""

from __future__ import annotations

WAIT_STATES = ("transform", "file_read", "socket_wait", "ipc_wait", "idle", "other")
"""What a thread waiting for data is doing (:mod:`trainmedic.probe.stacks`)."""
DATA_STATES = ("transform", "file_read", "socket_wait", "ipc_wait")
"""States of time outside the step that prepare data (:mod:`trainmedic.probe.host_states`)."""
OUTSIDE_STATES = ("sleep", "log", "sync", "file_write", "python")
"""States of time outside the step that do not (``other`` besides)."""

HELPER_STATES = ("socket", "file", "python", "cpu", "idle", "poll", "wait")
"""What the threads or processes a wait was handed to are doing
(:mod:`trainmedic.probe.handoff`)."""
BUSY_HELPER_STATES = ("socket", "file", "poll", "python", "cpu")
"""Helper states that do the work waited for; ``idle`` and ``wait`` do not."""
WAITS = "waits"
"""Key of the count of training-thread samples that waited on others."""
DELIVERED = "delivered"
"""Key of the count of those samples whose wait was already answered (the future done,
the queue holding an item) and no helper was working: the one that answered has just
gone idle, and the training thread only waited for the interpreter lock the sampler
held. Their helpers' observations are not counted (:mod:`trainmedic.probe.answered`)."""
IN_FLIGHT = "in_flight"
"""Key of the requests in flight summed over the observations waiting on I/O."""
THREAD_PREFIX = "thread:"
PROCESS_PREFIX = "process:"
SERVER_PREFIX = "server:"
"""Key prefix of the observations of a server at the far end of a helper's socket, by
:data:`trainmedic.host.peers.ACTIVITIES`."""
SERVER_RUNNING = "server_running"
"""Key of the servers' threads seen on a CPU, summed over their observations (cores)."""
PEER_PREFIX = "peer:"
"""Key prefix naming a server: ``peer:<pid> <command line>``, its observations."""
