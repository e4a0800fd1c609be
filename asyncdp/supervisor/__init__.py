"""The multi-port supervisor (``asyncdp serve --data-parallel-multi-port-external-lb``, spec §11.3): one
external-LB ``asyncdp serve`` child per local rank on consecutive ports, their health aggregated on the supervisor
port. :func:`~asyncdp.supervisor.process.run_supervisor` is the entry point; :mod:`.derive` computes the children's
command lines, :mod:`.probe` probes them, :mod:`.health_server` serves ``/health``, ``/ready`` and ``/readyz``,
:mod:`.children` spawns and watches one child, :mod:`.process` runs the lifecycle."""
