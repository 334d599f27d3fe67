"""Starting and stopping the job.

* :mod:`~trainmedic.supervise.launch.launcher` - the user's command as a child of a
  session holder, its environment, its process group and kin;
* :mod:`~trainmedic.supervise.launch.session_holder` - the standard-library process that
  leads the job's session, so the job itself may call ``setsid()``;
* :mod:`~trainmedic.supervise.launch.signals` - Ctrl-C, SIGTERM and SIGHUP forwarded and
  escalated;
* :mod:`~trainmedic.supervise.launch.stop` - SIGTERM, a grace period, SIGKILL, nothing left.
"""
