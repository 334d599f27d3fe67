"""The supervisor of ``trainmedic run``: launches the job and observes it from outside.

Its subpackages follow the run's flow:

* :mod:`~trainmedic.supervise.launch` - the job started in its own session, signals
  forwarded, the job stopped with nothing left behind;
* :mod:`~trainmedic.supervise.output` - the job's output passed through, saved, kept;
* :mod:`~trainmedic.supervise.observe` - GPU, host, thread and process readings, Xid errors;
* :mod:`~trainmedic.supervise.hang` - the watchdog, the silence's evidence, the stacks;
* :mod:`~trainmedic.supervise.loop` - the restart loop as a state machine, each attempt's
  record, where a restart resumes;
* :mod:`~trainmedic.supervise.live` - the live view and the Prometheus metrics.

At the top: :mod:`~trainmedic.supervise.session` (one run, wired together, wound down
cleanly), :mod:`~trainmedic.supervise.rundir` (where its record goes),
:mod:`~trainmedic.supervise.run_facts` and :mod:`~trainmedic.supervise.script_facts`
(the machine and script it ran on), :mod:`~trainmedic.supervise.fallback` (a supervisor
bug leaves the job running).
"""
