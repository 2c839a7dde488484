"""``python -m aiayn``: the ``aiayn`` command."""

from aiayn.cli import main

main()
