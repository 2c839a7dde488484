"""``aiayn --help`` and every command's ``--help`` as a user reads them: each paragraph reflowed to the
terminal (not broken where the source line broke), no reST markup, and every default an option's help
states shown. Typer's default "rich" markup kept the docstrings' hard line breaks and read
``[default: 4, or the bundle's]`` as a markup tag, so ``aiayn translate --help`` showed no default for
``--beam-size``, ``--len-penalty``, ``--max-len-a``, ``--max-len-b`` or ``--max-tokens``."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import typer
from typer.testing import CliRunner

from aiayn.cli.main import app
from aiayn.config.schema import EvalConfig
from aiayn.inference.runtimes import DecodeOptions

REPO = Path(__file__).resolve().parents[1]


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
    """The options default to None: the bundle's options, else the evaluate block of params.yaml; each help names
    the ``evaluate`` field that ``DecodeOptions.from_eval`` maps to that option."""
    shown = _flat(_help(monkeypatch, "translate"))
    e = EvalConfig(beam_size=3, len_penalty=0.7, max_len_a=1.5, max_len_b=20, max_tokens=900)
    options = DecodeOptions.from_eval(e)
    for option in ("--beam-size", "--len-penalty", "--max-len-a", "--max-len-b", "--max-tokens"):
        stated = re.search(re.escape(option) + r" .*?\[default: evaluate\.([a-z_]+)\]", shown)
        assert stated, option
        field = stated.group(1)
        assert field == option[2:].replace("-", "_") and getattr(options, field) == getattr(e, field), option


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


def test_a_stage_command_reads_params_from_root(tmp_path, monkeypatch):
    """`cd elsewhere && aiayn corpus --root ../proj` reads `--params` from `--root`, as `python -m
    pipelines.run_stage` does, not from the current folder (which gives "params file not found: params.yaml")."""
    import json

    proj, corpus, elsewhere = tmp_path / "proj", tmp_path / "corp", tmp_path / "elsewhere"
    for folder in (proj, corpus, elsewhere):
        folder.mkdir()
    for split in ("train", "val", "test"):
        (corpus / f"{split}.en").write_text("a small dog\ntwo cats\n", encoding="utf-8")
        (corpus / f"{split}.de").write_text("ein kleiner hund\nzwei katzen\n", encoding="utf-8")
    (proj / "params.yaml").write_text(json.dumps({
        "data": {"corpus": {"kind": "moses", "path": "../corp"}, "valid_split": "val", "test_splits": ["test"]},
        "quantize": {"gate_split": "test"}}), encoding="utf-8")
    monkeypatch.chdir(elsewhere)
    result = CliRunner().invoke(app, ["check", "--root", "../proj"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["corpus", "--root", "../proj"])
    assert result.exit_code == 0, result.output
    assert (proj / "artifacts" / "corpus" / "train.en").read_text(encoding="utf-8") == "a small dog\ntwo cats\n"
    # `aiayn monitor` takes the same options: it reads ../proj/params.yaml too, then stops at the missing reference
    result = CliRunner().invoke(app, ["monitor", "--root", "../proj", "--input", str(corpus / "test.en"), "--no-track"])
    assert result.exit_code == 2 and "aiayn monitor: error:" in result.output and "params" not in result.output, \
        result.output


def test_check_says_where_multi30k_comes_from_until_it_is_fetched(tmp_path):
    """``aiayn check`` on the default params in a project whose data/multi30k holds nothing: fine (exit 0), and one
    note naming ``aiayn fetch`` (without it, someone running the stages one by one gets "ok" and then a
    corpus-stage error); once the folder holds the corpus, no note."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    result = CliRunner().invoke(app, ["check", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output and "`aiayn fetch`" in result.output
    (tmp_path / "data" / "multi30k").mkdir(parents=True)
    (tmp_path / "data" / "multi30k" / "train.en").write_text("a dog\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["check", "--root", str(tmp_path)])
    assert result.exit_code == 0 and "`aiayn fetch`" not in result.output, result.output
