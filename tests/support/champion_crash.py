"""A writer of the champion history that kills itself with SIGKILL at one step of its alias move
(tests/test_champion_history.py: a crash mid-promotion leaves the old champion or the new one, and the next
writer or reader repairs the history).

``AIAYN_TEST_KILL_AT=<step>`` (``intent``: the intent event is written, the alias not moved; ``moved``: the
alias is moved, the event not done) names the step: this script sets ``aiayn.tracking.alias_events.step_hook``
to SIGKILL the process there (the product never sets the hook). Unset, it finishes.

``python -m support.champion_crash promote STORE NAME VERSION``: ``champion_history.promote``.
``python -m support.champion_crash register STORE ROOT BUNDLE BLEU``: the export stage's registration of
``BUNDLE`` (gate split ``test_a``) in a stage run under ``ROOT``: the version is created, then the alias moves.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

#: The step to die at (the tests' own switch, not a product setting).
KILL_AT_ENV = "AIAYN_TEST_KILL_AT"


def _kill_at(step: str) -> None:
    if step == os.environ.get(KILL_AT_ENV):
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    from aiayn.tracking import alias_events

    alias_events.step_hook = _kill_at
    if argv[0] == "promote":
        from aiayn.tracking.champion_history import open_registry, promote

        store, name, version = argv[1:4]
        promote(open_registry(store), name, version, tracking_uri=store, reason="crash test promotion")
        return 0
    from aiayn.export.bundle import register_bundle
    from aiayn.inference.artifacts import read_bundle_info
    from aiayn.tracking import Tracker

    store, root, bundle, bleu = argv[1], Path(argv[2]), Path(argv[3]), float(argv[4])
    with Tracker("export", project_root=root, tracking_uri=store, end_pipeline=True) as t:
        out = register_bundle(t, bundle, name="aiayn-en-de", variant=read_bundle_info(bundle)["variant"],
                              gate_split="test_a", bleu=bleu, example=["a man"], provenance={"git_commit": "c0ffee"})
    return 0 if out is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
