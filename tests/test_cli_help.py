"""``aiayn --help`` and every command's ``--help`` as a user reads them: each paragraph reflowed to the
terminal (not broken where the source line broke), no reST markup, and every default an option's help
states shown. Typer's default "rich" markup kept the docstrings' hard line breaks and read
``[default: 4, or the bundle's]`` as a markup tag, so ``aiayn translate --help`` showed no default for
``--beam-size``, ``--len-penalty``, ``--max-len-a``, ``--max-len-b`` or ``--max-tokens``."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from aiayn.cli import app
from aiayn.decoders import DecodeOptions


def _group():
    return typer.main.get_command(app)


def _help(monkeypatch, *args: str) -> str:
    monkeypatch.setenv("COLUMNS", "400")  # wide: a paragraph or an option's help fits on one line
    result = CliRunner().invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_every_default_an_option_states_is_shown(monkeypatch):
    group, checked = _group(), []
    for name, command in sorted(group.commands.items()):
        shown = _flat(_help(monkeypatch, name))
        for param in command.params:
            for stated in re.findall(r"\[default: [^\]]+\]", getattr(param, "help", None) or ""):
                assert stated in shown, f"aiayn {name} --help lost {stated!r} of {param.name}"
                checked.append((name, param.name))
    assert {("translate", p) for p in ("beam_size", "len_penalty", "max_len_a", "max_len_b", "max_tokens")} <= set(checked)


def test_the_defaults_translate_states_are_its_decoding_defaults(monkeypatch):
    """The numbers are written into the help by hand (the options default to None: the bundle's, else these)."""
    shown = _flat(_help(monkeypatch, "translate"))
    for option, value in [("--beam-size", DecodeOptions.beam_size), ("--len-penalty", DecodeOptions.len_penalty),
                          ("--max-len-a", DecodeOptions.max_len_a), ("--max-len-b", DecodeOptions.max_len_b),
                          ("--max-tokens", DecodeOptions.max_tokens)]:
        stated = re.search(re.escape(option) + r" .*?\[default: ([0-9.]+), or the bundle's\]", shown)
        assert stated and float(stated.group(1)) == value, (option, value)


def test_each_paragraph_of_a_help_text_is_one_line_without_markup(monkeypatch):
    group = _group()
    for name, help_text in [("", group.help)] + [(n, c.help) for n, c in sorted(group.commands.items())]:
        out = _help(monkeypatch, *([name] if name else []))
        assert "``" not in out, f"aiayn {name} --help shows reST markup"
        lines = {_flat(line) for line in out.splitlines()}
        for paragraph in (help_text or "").split("\n\n"):
            words = _flat(paragraph.replace("`", ""))
            if words:
                assert words in lines, f"aiayn {name} --help breaks or changes the paragraph {words[:60]!r}..."
