"""What the supervisor reads about the running job, besides hangs.

* :mod:`~trainmedic.supervise.observe.samplers` - GPU (backend) and host (psutil) readings;
* :mod:`~trainmedic.supervise.observe.threads` - the job's threads on a CPU or waiting for one;
* :mod:`~trainmedic.supervise.observe.procview` - the kernel's view of the job's processes;
* :mod:`~trainmedic.supervise.observe.census` - every process the job ran;
* :mod:`~trainmedic.supervise.observe.processes` - probe messages routed to the record;
* :mod:`~trainmedic.supervise.observe.xid_watch` - Xid errors as run events;
* :mod:`~trainmedic.supervise.observe.observers` - all of them (and the live view) started
  with the job and stopped with it.
"""
