"""``python -m aiayn``: the ``aiayn`` command."""

from aiayn.cli.main import main

main()
