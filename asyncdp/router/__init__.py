"""The external router role, ``asyncdp route``: one address in front of several asyncdp endpoints.

:mod:`.score` (pure: what the router knows of each endpoint, and the order to try them in), :mod:`.poller`
(``GET /load`` of every endpoint), :mod:`.proxy` (the ASGI reverse proxy), :mod:`.body` (a request's body, held
for failover or streamed), :mod:`.headers` (pure: what is forwarded, ``X-Forwarded-*``), :mod:`.telemetry` (pure:
the router's own ``/load``), :mod:`.process` (the process main), :mod:`.settings` and :mod:`.command` (flags). See
docs/howto/external-lb.md, "asyncdp route".
"""
