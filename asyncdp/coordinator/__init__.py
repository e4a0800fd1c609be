"""The DP coordinator role: :mod:`.core` aggregates rank load and runs the wave machine; :mod:`.process` is its
child-process main."""
