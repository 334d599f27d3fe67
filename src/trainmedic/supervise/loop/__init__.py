"""The restart loop: attempts of one job until it succeeds or the policy stops.

* :mod:`~trainmedic.supervise.loop.attempts` - the loop, its launch, stop and hang capture
  passed in;
* :mod:`~trainmedic.supervise.loop.attempt_state` - its states and the transitions allowed;
* :mod:`~trainmedic.supervise.loop.attempt_setup` - what the loop is given and gives back;
* :mod:`~trainmedic.supervise.loop.attempt_record` - each attempt's record and ``attempt.json``;
* :mod:`~trainmedic.supervise.loop.evidence` - what an attempt left, read for classification;
* :mod:`~trainmedic.supervise.loop.resume` - the checkpoint a restart resumes from.
"""
