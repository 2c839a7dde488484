"""``aiayn <verb>``: one command per pipeline stage, plus ``translate`` and ``presets``.

Every stage verb calls the same ``aiayn.stages.<name>.run`` that ``dvc.yaml``
(through the Prefect flows in ``pipelines/``) runs.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from aiayn.config import ConfigError, load_params
from aiayn.stages import Layout

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)

ParamsOpt = Annotated[Path, typer.Option("--params", "-p", help="params.yaml to read.")]
RootOpt = Annotated[Path, typer.Option("--root", help="Project root (artifacts/ and data/ live under it).")]


def setup_logging(level: int = logging.INFO) -> None:
    """Log ``aiayn`` messages to stderr (rich formatting on a terminal)."""
    logger = logging.getLogger("aiayn")
    if logger.handlers:
        return
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False)
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def run_stage(name: str, params_path: Path, root: Path) -> dict:
    """Load params and run stage ``name``; returns its summary."""
    setup_logging()
    params = load_params(params_path)
    module = importlib.import_module(f"aiayn.stages.{name}")
    return module.run(params, Layout(root))


def _stage_command(name: str, doc: str) -> None:
    def command(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
        try:
            summary = run_stage(name, params, root)
        except (ConfigError, FileNotFoundError, ValueError) as e:
            typer.echo(f"aiayn {name}: error: {e}", err=True)
            raise typer.Exit(2) from e
        typer.echo(json.dumps(summary, indent=2, default=str))

    command.__doc__ = doc
    app.command(name=name)(command)


_stage_command("prepare", "Validate, normalise (NFC) and filter the raw corpus into artifacts/prepared.")
_stage_command("tokenize", "Train the joint sentencepiece model and encode every split into artifacts/tokenized.")
_stage_command("train", "Train (or resume) the Transformer; write the averaged model bundle to artifacts/model.")
_stage_command("evaluate", "Translate the test sets with beam search and score them with sacreBLEU.")


@app.command()
def fetch(
    mirror: Annotated[Optional[Path], typer.Option(help="Copy from this folder instead of downloading (env AIAYN_DATA_MIRROR).")] = None,
    root: RootOpt = Path("."),
) -> None:
    """Download (or copy from a mirror) the Multi30k corpus into data/multi30k, verifying SHA-256."""
    setup_logging()
    from aiayn.stages import fetch as fetch_stage

    try:
        summary = fetch_stage.run(Layout(root), mirror=mirror)
    except (OSError, ValueError) as e:
        typer.echo(f"aiayn fetch: error: {e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(json.dumps(summary, indent=2, default=str))


@app.command()
def translate(
    input: Annotated[Optional[Path], typer.Argument(help="One sentence per line; '-' or absent: standard input.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write translations here (default: stdout).")] = None,
    model_dir: Annotated[Path, typer.Option(help="Model bundle (model.json, model.safetensors, spm.model).")] = Path("artifacts/model"),
    checkpoint: Annotated[Optional[Path], typer.Option(help="Use these weights instead (a .safetensors or a ckpt_*.json).")] = None,
    beam_size: Annotated[int, typer.Option(min=1, help="1 = greedy.")] = 4,
    len_penalty: Annotated[float, typer.Option(min=0.0)] = 0.6,
    max_len_a: Annotated[float, typer.Option(min=0.0)] = 1.0,
    max_len_b: Annotated[int, typer.Option(min=1)] = 50,
    max_tokens: Annotated[int, typer.Option(min=16, help="Source tokens per batch.")] = 4000,
) -> None:
    """Translate sentences (one per line) with the pipeline's latest model."""
    setup_logging(logging.WARNING)
    from aiayn.checkpoint import CheckpointError
    from aiayn.translate import DecodeOptions, Translator

    try:
        if input is None or str(input) == "-":
            lines = sys.stdin.read().splitlines()
        else:
            lines = input.read_text(encoding="utf-8").splitlines()
        translator = Translator.from_dir(model_dir, weights=checkpoint)
        options = DecodeOptions(beam_size=beam_size, len_penalty=len_penalty, max_len_a=max_len_a,
                                max_len_b=max_len_b, max_tokens=max_tokens)
        show = len(lines) >= 50 and sys.stderr.isatty()
        if show:
            from rich.progress import Progress

            with Progress(transient=True) as bar:
                task = bar.add_task("translate", total=len(lines))
                hyps = translator.translate(lines, options, progress=lambda n: bar.advance(task, n))
        else:
            hyps = translator.translate(lines, options)
    except (OSError, UnicodeDecodeError, ValueError, CheckpointError) as e:
        typer.echo(f"aiayn translate: error: {e}", err=True)
        raise typer.Exit(2) from e
    text = "".join(h + "\n" for h in hyps)
    if output:
        from aiayn.io import atomic_write_text

        atomic_write_text(output, text)
    else:
        sys.stdout.write(text)


@app.command()
def presets(vocab_size: Annotated[int, typer.Option(help="Shared vocabulary (WMT14 En-De: 37000 BPE).")] = 37000) -> None:
    """Print each model preset's hyperparameters and parameter count."""
    from rich.console import Console
    from rich.table import Table

    from aiayn.config import MODEL_PRESETS, model_preset
    from aiayn.model import Transformer

    table = Table("preset", "d_model", "n_heads", "d_ff", "n_layers", "dropout", "parameters")
    for name in MODEL_PRESETS:
        cfg = model_preset(name, vocab_size=vocab_size)
        n = Transformer(cfg, device="meta").num_parameters()
        table.add_row(name, str(cfg.d_model), str(cfg.n_heads), str(cfg.d_ff), str(cfg.n_layers), str(cfg.dropout), f"{n / 1e6:.1f}M")
    Console().print(table)


if __name__ == "__main__":
    app()
