"""``make help``: every target a user can name (``.PHONY``) is listed with its ``##`` comment."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_make_help_lists_every_target_with_its_comment():
    phony = re.search(r"^\.PHONY: (.*)$", (REPO / "Makefile").read_text(encoding="utf-8"), re.M).group(1).split()
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = re.findall(r"^make (\S+)\n {4}\S", out.stdout, re.M)  # the target, then its comment's first line
    assert sorted(listed) == sorted(phony), out.stdout
    assert "make run\n    The main job" in out.stdout
