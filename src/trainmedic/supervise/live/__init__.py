"""What the run is doing now, for a person and for a fleet.

* :mod:`~trainmedic.supervise.live.status` - the live status's data;
* :mod:`~trainmedic.supervise.live.view` - the status as a terminal panel or status lines;
* :mod:`~trainmedic.supervise.live.metrics` - the Prometheus metrics of ``run --prometheus``;
* :mod:`~trainmedic.supervise.live.metrics_server` - their HTTP endpoint.
"""
