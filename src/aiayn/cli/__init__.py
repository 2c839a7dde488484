"""The ``aiayn`` command (typer): ``main`` holds the app and its verbs; ``stage_commands`` what every
stage verb is built from (logging, ``--params``/``--root``, exit statuses)."""
