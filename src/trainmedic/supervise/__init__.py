"""The supervisor of ``trainmedic run``: launches the job and observes it from outside.

* :mod:`~trainmedic.supervise.launcher` - the child in its own session, leftovers;
* :mod:`~trainmedic.supervise.signals` - Ctrl-C and SIGTERM forwarded and escalated;
* :mod:`~trainmedic.supervise.output` - the job's output passed through and saved;
* :mod:`~trainmedic.supervise.samplers` - GPU (backend) and host (psutil) readings;
* :mod:`~trainmedic.supervise.processes` - probe messages routed; the job's processes;
* :mod:`~trainmedic.supervise.live` / :mod:`~trainmedic.supervise.live_view` - the live
  status, shown as a panel or status lines;
* :mod:`~trainmedic.supervise.observers` - the samplers and the live view, started with the job;
* :mod:`~trainmedic.supervise.attempts` - the restart loop;
* :mod:`~trainmedic.supervise.session` - one run, wired together, wound down cleanly.
"""
