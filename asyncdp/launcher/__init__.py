"""The launcher role: what ``asyncdp serve`` runs on a node.

:mod:`.launch_plan` resolves the command line and the model into a launch plan; :mod:`.plan` computes, purely,
the node's launch table (processes, start order, links) from the resolved deployment; :mod:`.head` runs the node,
:mod:`.startup` performs the table's start order, :mod:`.handshake` answers each engine, :mod:`.children` spawns,
watches and stops the children; :mod:`.node` is the state they share."""
