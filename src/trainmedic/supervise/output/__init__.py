"""The job's output: passed through, saved, and kept when the supervisor dies.

* :mod:`~trainmedic.supervise.output.stream` - to the terminal (or pipe) and the run directory;
* :mod:`~trainmedic.supervise.output.keeper` - the keeper process that outlives a killed
  supervisor;
* :mod:`~trainmedic.supervise.output.keeper_main` - that process, standard library only.
"""
