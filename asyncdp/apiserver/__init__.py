"""The API-server role: the DP client (:mod:`.client`) that routes requests to ranks, and what it is made of:
its config (:mod:`.client_config`), admission slots (:mod:`.admission`), engine links and utility calls with
their deadlines (:mod:`.engine_links`), the handlers of what those links bring in (:mod:`.engine_events`),
per-request output streams (:mod:`.request_stream`), the coordinator
link (:mod:`.coordinator_follower`), metrics export (:mod:`.stats_export`, :mod:`.metrics`), the node table
shared by sibling API processes, ``/server_info``, and the process main (:mod:`.process`) that serves the HTTP
app of :mod:`asyncdp.api` around them."""
