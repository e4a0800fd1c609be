"""The external router role, ``asyncdp route``: one address in front of several asyncdp endpoints.

:mod:`.score` (pure: what the router knows of each endpoint, and the order to try them in), :mod:`.poller`
(``GET /load`` of every endpoint), :mod:`.proxy` (the ASGI reverse proxy), :mod:`.process` (the process main),
:mod:`.settings` and :mod:`.command` (flags). See docs/howto/external-lb.md, "asyncdp route".
"""
