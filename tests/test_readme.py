"""README.md is a guide a new user copies from, so what it shows must work.

- Every line of a fenced ``bash`` / ``sh`` block that runs ``aiayn ...`` (also ``.venv/bin/aiayn``, after
  ``X=1`` assignments, inside a pipe or a ``&&`` list) names a command the ``aiayn`` app has, and every
  ``--flag`` / ``-f`` it shows is an option of that command (read from the typer app itself,
  ``aiayn.cli.main.app``). Every ``make ...`` names targets the Makefile has and ``NAME=value``
  arguments it reads (``PARAMS=``, ``TEST_WORKERS=``, ...). An ``AIAYN_*`` assignment names a variable
  ``aiayn.config.settings`` declares.
- Every fenced ``yaml`` block, merged over ``params.yaml`` (deep merge), passes ``aiayn check``'s checks
  (``aiayn.config.checks.check_params_file``, without looking at the disk for local corpus folders).
- The guide's shape: at most 300 lines and 25,000 characters, ``make run`` and ``make test`` on its
  first screen, and every relative link pointing at a file of the repository.

The checkers take README text, so the tests below also feed them a broken README and expect the
breakage to be reported: a check that cannot fail checks nothing.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES, MAX_CHARS, FIRST_SCREEN = 300, 25_000, 25

#: ``` fences: (language, body, line number of the opening fence).
_FENCE = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
#: Control operators that end a simple command (shlex with punctuation_chars yields them as tokens).
_SEPARATORS = {"|", "||", "&", "&&", ";", ";;", "(", ")", "|&"}
_REDIRECTS = {"<", ">", ">>", "<<", "<<<", ">&", "<&", "&>", ">|"}
#: Words that run the command after them.
_PREFIXES = {"time", "nohup", "exec", "env", "command", "do", "then", "else", "if", "while", "until", "!"}
#: make's own options a README may show.
_MAKE_FLAGS = re.compile(r"^-(?:[nskB]|j\d*)$")


def fenced_blocks(text: str, languages: set[str]) -> Iterator[tuple[str, str, int]]:
    """``(language, body, line)`` of each fenced block of one of ``languages``."""
    for m in _FENCE.finditer(text):
        if m.group(1).lower() in languages:
            yield m.group(1).lower(), m.group(2), text.count("\n", 0, m.start()) + 1


def _logical_lines(body: str, first_line: int) -> Iterator[tuple[int, list[str] | None, str]]:
    """``(line number, tokens or None when unparsable, source)`` per shell command line: backslash
    continuations joined, a quote left open continued on the next line, ``#`` comments dropped."""
    lines = body.split("\n")
    i = 0
    while i < len(lines):
        start, source = i, lines[i]
        i += 1
        while source.rstrip().endswith("\\") and i < len(lines):
            source = source.rstrip()[:-1] + " " + lines[i]
            i += 1
        while True:
            try:
                lexer = shlex.shlex(source, posix=True, punctuation_chars=True)
                lexer.whitespace_split = True
                lexer.commenters = "#"
                tokens = list(lexer)
                break
            except ValueError:
                if i >= len(lines):
                    tokens = None
                    break
                source += "\n" + lines[i]
                i += 1
        yield first_line + 1 + start, tokens, source.strip()


def _simple_commands(tokens: list[str]) -> Iterator[list[str]]:
    """The simple commands of one line's tokens (split at ``|``, ``&&``, ``;`` ...; redirections dropped)."""
    command: list[str] = []
    skip = False
    for tok in tokens:
        if skip:
            skip = False
        elif tok in _SEPARATORS:
            if command:
                yield command
            command = []
        elif tok in _REDIRECTS:
            skip = True  # its file name
        else:
            command.append(tok)
    if command:
        yield command


@cache
def aiayn_options() -> dict[str, set[str]]:
    """``{command: {option spellings}}`` of the ``aiayn`` app (``""``: the group itself)."""
    import typer

    from aiayn.cli.main import app

    group = typer.main.get_command(app)
    out = {"": {"--help"} | {o for p in group.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}}
    for name, command in group.commands.items():
        subs = [command, *getattr(command, "commands", {}).values()]  # a group (`aiayn review`): its commands' options too
        out[name] = {"--help"} | {o for c in subs for p in c.params if p.param_type_name == "option"
                                  for o in (*p.opts, *p.secondary_opts)}
    return out


@cache
def makefile_names(path: Path = REPO / "Makefile") -> tuple[frozenset[str], frozenset[str]]:
    """``(targets, variables)`` of the Makefile: rule targets, and every upper-case variable it assigns or reads
    (``$(PARAMS)`` is read, never assigned: ``make run PARAMS=...``)."""
    text = path.read_text(encoding="utf-8")
    targets, variables = set(), set()
    for line in text.splitlines():
        if line.startswith(("\t", "#")):
            continue
        m = re.match(r"^(?:export\s+|override\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*(?:\?|:|::|\+|!)?=", line)
        if m:
            variables.add(m.group(1))
            continue
        m = re.match(r"^([^\s:=$#][^:=$#]*?)\s*::?(?!=)", line)
        if m:
            targets.update(t for t in m.group(1).split() if not t.startswith("."))
    variables.update(re.findall(r"\$[({]([A-Z_][A-Z0-9_]*)[)}]", text))
    return frozenset(targets), frozenset(variables)


@cache
def settings_variables() -> frozenset[str]:
    """The ``AIAYN_*`` variables ``aiayn.config.settings`` declares (its ``*_ENV`` names)."""
    from aiayn.config import settings

    return frozenset(v for k, v in vars(settings).items() if k.endswith("_ENV") and isinstance(v, str))


def _check_aiayn(args: list[str], where: str) -> list[str]:
    options = aiayn_options()
    words = [a for a in args if not a.startswith("-")]
    if not words:
        bad = [a.split("=", 1)[0] for a in args if a.startswith("--") and a.split("=", 1)[0] not in options[""]]
        return [f"{where}: `aiayn` has no option {', '.join(bad)}"] if bad else (
            [] if args else [f"{where}: `aiayn` without a command"])
    command = words[0]
    if command not in options or not command:
        return [f"{where}: `aiayn {command}`: no such command (commands: {', '.join(sorted(c for c in options if c))})"]
    problems, before = [], args[: args.index(command)]
    for a in before:  # options before the command are the group's
        if a.startswith("-") and a.split("=", 1)[0] not in options[""]:
            problems.append(f"{where}: `aiayn` has no option {a}")
    for a in args[args.index(command) + 1:]:
        flag = a.split("=", 1)[0]
        if re.match(r"^--[A-Za-z]|^-[A-Za-z]$", flag) and flag not in options[command]:
            problems.append(f"{where}: `aiayn {command}` has no option {flag}")
    return problems


def _check_make(args: list[str], where: str) -> list[str]:
    targets, variables = makefile_names()
    problems = []
    for a in args:
        m = _ASSIGNMENT.match(a)
        if m:
            if m.group(1) not in variables:
                problems.append(f"{where}: the Makefile reads no variable {m.group(1)} (`make ... {a}`)")
        elif a.startswith("-"):
            if not _MAKE_FLAGS.match(a):
                problems.append(f"{where}: `make {a}`: not a make option this README may show")
        elif a not in targets:
            problems.append(f"{where}: `make {a}`: the Makefile has no target {a} (targets: {', '.join(sorted(targets))})")
    return problems


def command_problems(text: str) -> list[str]:
    """Every ``aiayn`` / ``make`` invocation in ``text``'s bash/sh blocks that names a command, target, option
    or variable that does not exist; one line each (empty: all real)."""
    problems = []
    for _, body, fence_line in fenced_blocks(text, {"bash", "sh", "shell", "console"}):
        for line, tokens, source in _logical_lines(body, fence_line):
            where = f"README line {line}"
            if tokens is None:
                problems.append(f"{where}: unbalanced quotes: {source[:80]}")
                continue
            for command in _simple_commands(tokens):
                i = 0
                while i < len(command) and (_ASSIGNMENT.match(command[i]) or command[i] in _PREFIXES):
                    m = _ASSIGNMENT.match(command[i])
                    if m and m.group(1).startswith("AIAYN_") and m.group(1) not in settings_variables():
                        problems.append(f"{where}: {m.group(1)} is no variable of aiayn.config.settings")
                    i += 1
                if i == len(command):
                    continue
                program, args = command[i], command[i + 1:]
                if program == "aiayn" or program.endswith("/aiayn"):
                    problems += _check_aiayn(args, where)
                elif program.endswith("python") and args[:2] == ["-m", "aiayn"]:
                    problems += _check_aiayn(args[2:], where)
                elif program == "make":
                    problems += _check_make(args, where)
    return problems


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def yaml_problems(text: str, params_path: Path = REPO / "params.yaml") -> list[str]:
    """Every ``yaml`` block of ``text`` that, merged over ``params_path``, fails ``aiayn check``'s checks;
    one line per problem (empty: every block is a valid fragment of params.yaml)."""
    from aiayn.config.checks import check_params_file

    base = yaml.safe_load(params_path.read_text(encoding="utf-8"))
    problems = []
    for _, body, line in fenced_blocks(text, {"yaml", "yml"}):
        where = f"README line {line}"
        try:
            fragment = yaml.safe_load(body)
        except yaml.YAMLError as e:
            problems.append(f"{where}: not valid YAML: {' '.join(str(e).split())}")
            continue
        if not isinstance(fragment, dict):
            problems.append(f"{where}: a params.yaml fragment is a mapping of its blocks (data:, train:, ...)")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            merged = Path(tmp) / "params.yaml"
            merged.write_text(yaml.safe_dump(_deep_merge(base, fragment), sort_keys=False), encoding="utf-8")
            problems += [f"{where}: {p}" for p in check_params_file(merged, root=None)]
    return problems


def link_problems(text: str, base: Path = REPO) -> list[str]:
    """Relative markdown links of ``text`` whose file does not exist under ``base``."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):
            continue
        path = target.split("#", 1)[0]
        if path and not (base / path).exists():
            problems.append(f"link to {target}: no such file")
    return problems


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text(encoding="utf-8")


def test_every_aiayn_and_make_command_in_the_readme_exists(readme):
    assert list(fenced_blocks(readme, {"bash"})), "the README shows no bash block: the check would pass on nothing"
    assert command_problems(readme) == []


def test_every_yaml_block_in_the_readme_is_a_valid_params_fragment(readme):
    assert list(fenced_blocks(readme, {"yaml"})), "the README shows no yaml block: the check would pass on nothing"
    assert yaml_problems(readme) == []


def test_the_readme_is_a_guide_of_one_screen_then_sections(readme):
    assert len(readme.splitlines()) <= MAX_LINES and len(readme) <= MAX_CHARS, (len(readme.splitlines()), len(readme))
    first = "\n".join(readme.splitlines()[:FIRST_SCREEN])
    assert "make run" in first and "make test" in first


def test_every_relative_link_in_the_readme_points_at_a_file(readme):
    assert link_problems(readme) == []


def _bash(*lines: str) -> str:
    return "intro\n\n```bash\n" + "\n".join(lines) + "\n```\n"


def test_the_command_check_reports_a_misspelt_flag_command_target_and_variable():
    assert command_problems(_bash("echo 'A man.' | aiayn translate --beam-size 5 --nbest 2 --scores")) == []
    problems = command_problems(_bash("echo 'A man.' | aiayn translate --beam-sise 5"))
    assert len(problems) == 1 and "--beam-sise" in problems[0] and "translate" in problems[0]
    assert "no such command" in " ".join(command_problems(_bash(".venv/bin/aiayn transalte in.txt")))
    assert "-Z" in " ".join(command_problems(_bash("aiayn serve -Z")))
    assert "--beam-sise" in " ".join(command_problems(_bash("cat in.txt | X=1 aiayn translate \\", "  --beam-sise 5")))
    assert "--jsn" in " ".join(command_problems(_bash("aiayn serve --port 8080 & sleep 1 && aiayn monitor --jsn")))
    assert command_problems(_bash("AIAYN_DATA_MIRROR=/m make run PARAMS=configs/smoke.yaml", "make test-fast")) == []
    assert "no target" in " ".join(command_problems(_bash("make tests")))
    assert "PARAM" in " ".join(command_problems(_bash("make run PARAM=configs/smoke.yaml")))
    assert "AIAYN_DATA_MIROR" in " ".join(command_problems(_bash("AIAYN_DATA_MIROR=/m make run")))
    assert command_problems("```python\naiayn.nothing()\n```\n```bash\n# aiayn nothing\n```\n") == []


def test_the_yaml_check_reports_an_unknown_key_a_bad_value_and_a_cross_field_problem():
    ok = "```yaml\ndata:\n  corpus: {kind: tsv, path: corpora/mine}\n  test_splits: [test]\nquantize:\n  gate_split: test\n```\n"
    assert yaml_problems(ok) == []
    assert "beam_sise" in " ".join(yaml_problems("```yaml\nevaluate:\n  beam_sise: 5\n```\n"))
    assert "train.max_steps" in " ".join(yaml_problems("```yaml\ntrain:\n  max_steps: -1\n```\n"))
    assert "gate_split" in " ".join(yaml_problems("```yaml\ndata:\n  test_splits: [test]\n```\n"))
    assert "mapping" in " ".join(yaml_problems("```yaml\n- data\n```\n"))


def test_the_link_check_reports_a_missing_file():
    assert link_problems("[a](docs/no-such-page.md) [b](https://example.org/x) [c](#section)") == [
        "link to docs/no-such-page.md: no such file"]
