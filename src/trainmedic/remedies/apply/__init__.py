"""What ``trainmedic run --apply-from SOURCE`` applies, decided by the supervisor.

Apart from the remedies a training script calls (the rest of :mod:`trainmedic.remedies`),
this part runs in the supervisor before the job starts:

* :mod:`~trainmedic.remedies.apply.plan` - the plan: the loader settings and torch
  switches a previous run's findings (or a tuning file) recommend, validated and bounded
  by this machine, handed to the job's probe in one environment variable;
* :mod:`~trainmedic.remedies.apply.switches` - which safe, reversible torch switches may
  be turned on and when: decided here from the run's evidence, and again in the job
  (:mod:`trainmedic.probe.apply`) from what the job itself shows.
"""
