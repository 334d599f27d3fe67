"""``trainmedic attach PID``: a job already running, observed from outside only.

:mod:`~trainmedic.attach.tree` finds the job's processes from one PID and
names them; :mod:`~trainmedic.attach.access` says whether their memory may be
read; :mod:`~trainmedic.attach.spy` samples every thread's Python stack with
py-spy, without stopping them; :mod:`~trainmedic.attach.observe` joins those
samples to what ``/proc`` shows over the same window. The judgment is
:mod:`~trainmedic.attach.judge`'s.
"""
