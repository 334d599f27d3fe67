"""The supervisor of ``trainmedic run``: launches the job and observes it from outside.

* :mod:`~trainmedic.supervise.launcher` - the child in its own session, signals, leftovers;
* :mod:`~trainmedic.supervise.output` - the job's output passed through and saved;
* :mod:`~trainmedic.supervise.samplers` - GPU (backend) and host (psutil) readings;
* :mod:`~trainmedic.supervise.processes` - probe messages routed; the job's processes;
* :mod:`~trainmedic.supervise.live` - the live panel or status lines;
* :mod:`~trainmedic.supervise.session` - one run, wired together, wound down cleanly.
"""
