"""``python -m asyncdp``: the same as the ``asyncdp`` command."""

from asyncdp.cli import main

raise SystemExit(main())
