"""A job that stops making progress: noticed, explained, its evidence kept.

* :mod:`~trainmedic.supervise.hang.watchdog` - observes one attempt and says when it hangs;
* :mod:`~trainmedic.supervise.hang.liveness` - evidence about a silence, a few times a second;
* :mod:`~trainmedic.supervise.hang.forensics` - the stacks of a hung job, taken before it is
  stopped;
* :mod:`~trainmedic.supervise.hang.stack_dumps` - those stacks read back, and where it hung.
"""
