"""Provenance: the git commit a run records, and whether the tree was dirty."""

from __future__ import annotations

import subprocess
from pathlib import Path

from aiayn.provenance import git_commit


def test_git_commit(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == (None, False)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (tmp_path / "a.txt").write_text("1")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = (tmp_path / ".git" / "refs" / "heads" / "main").read_text().strip()
    assert git_commit(tmp_path) == (head, False)
    (tmp_path / "untracked.txt").write_text("u")
    assert git_commit(tmp_path) == (head, False)  # untracked files do not count
    (tmp_path / "a.txt").write_text("2")
    assert git_commit(tmp_path) == (head, True)
