"""The local channel from the probe (inside the job) to the supervisor.

One connection per process of the job, over a Unix domain socket in the run
directory (or 127.0.0.1 TCP where ``AF_UNIX`` is missing), carrying one JSON
object per line (:mod:`trainmedic.channel.wire`). The probe writes with
:class:`~trainmedic.channel.client.ChannelClient`; the supervisor reads with
:class:`~trainmedic.channel.server.ChannelServer`.
"""
