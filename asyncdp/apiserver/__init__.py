"""The API-server role: the DP client (:mod:`.client`) that routes requests to ranks, its coordinator link
(:mod:`.coordinator_follower`), the node table shared by sibling API processes, metrics, ``/server_info``, and
the process main (:mod:`.process`) that serves the HTTP app of :mod:`asyncdp.api` around them."""
