"""The launcher role: what ``asyncdp serve`` runs. :mod:`.launch_plan` resolves the command line and the model
into a launch plan; :mod:`.head` starts and stops the processes of this node."""
