"""``aiayn <verb>``: one command per pipeline stage, plus ``check``, ``fetch``, ``monitor``, ``translate``, ``serve``, ``registry``, ``export-hf`` and ``presets``.

Every stage verb calls the same ``run`` of the stage's module that ``dvc.yaml`` (through the Prefect
flows in ``pipelines/``) runs, with the MLflow recorder. The drift monitor's verbs come from the
``monitoring`` package, which declares them as ``aiayn.cli.stage_commands`` entry points.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from aiayn.cli.registry_commands import registry as registry_commands
from aiayn.cli.stage_commands import COMMANDS_GROUP, ParamsOpt, RootOpt, setup_logging, stage_command, under_root
from aiayn.cli.translate_output import SIGNAL_FIELDS
from aiayn.cli.translate_output import answers as _answers
from aiayn.exitcodes import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED
from aiayn.stages import Layout

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode="markdown")


def main() -> None:
    """The ``aiayn`` console script and ``python -m aiayn``: the process defaults
    (``aiayn.config.settings.apply_process_defaults``, before anything loads torch; they depend on the
    command, the first word of the command line that is not an option), then the app."""
    from aiayn.config.settings import apply_process_defaults

    # the app has no global option that takes a value (no callback), so the first word is the command
    apply_process_defaults(stage=next((word for word in sys.argv[1:] if not word.startswith("-")), None))
    app()


def _stage_command(name: str, doc: str) -> None:
    app.command(name=name)(stage_command(name, f"aiayn.stages.{name}", doc))


_stage_command("corpus", "Snapshot the configured corpus source (data.corpus) for the pair into artifacts/corpus, checksummed.")
_stage_command("prepare", "Validate, normalise (NFC) and filter the raw corpus into artifacts/prepared.")
_stage_command("tokenize", "Train the joint sentencepiece model and encode every split into artifacts/tokenized.")
_stage_command("train", "Train (or resume) the Transformer; write the chosen (train.select, validated) model bundle to artifacts/model.")
_stage_command("evaluate", "Translate the test sets with beam search and score them with sacreBLEU.")
_stage_command("quantize", "Build CTranslate2/torchao quantized variants, evaluate each, gate on BLEU (artifacts/quantized).")
_stage_command("export", "Build the serving bundle (artifacts/export) and register it in the MLflow Model Registry.")


def _project_commands() -> None:
    """Register the commands the project's other packages declare in the ``aiayn.cli.stage_commands``
    entry-point group of the ``aiayn`` distribution (the drift monitor's ``monitor`` and
    ``monitor-reference``; a ``typer.Typer`` becomes a group: ``review``). Every ``aiayn`` metadata folder on ``sys.path`` is read, first one wins
    per command, so a stale ``aiayn.egg-info`` in the working directory cannot hide the installed
    ones. A command that cannot load is left out with one line on stderr; the rest still work."""
    from importlib.metadata import distributions

    declared = {}
    for dist in distributions(name="aiayn"):
        for ep in dist.entry_points.select(group=COMMANDS_GROUP):
            declared.setdefault(ep.name, ep)
    for name, ep in sorted(declared.items()):
        try:
            command = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken extra command must not take the CLI down
            print(f"aiayn: command {name!r} unavailable: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if isinstance(command, typer.Typer):  # a group of commands (`aiayn review export|import|stats`)
            app.add_typer(command, name=name)
        else:
            app.command(name=name)(command)


_project_commands()
app.add_typer(registry_commands, name="registry")  # `aiayn registry history|rollback`


@app.command()
def check(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Check params.yaml before any stage runs: every problem at once (blocks that do not load, and the
    cross-field checks: gate split, splits the corpus lacks, vocabulary, grad_accum vs nproc_per_node, ...;
    keys dvc.yaml's stages name that the file lacks). Exit status: 0 fine, 2 problems (one line each)."""
    from aiayn.config.checks import check_params_file, dvc_problems, fetch_note

    params = under_root(params, root)
    problems = check_params_file(params, root) + dvc_problems(params, root)
    for problem in problems:
        typer.echo(f"{params}: {problem}", err=True)
    if problems:
        typer.echo(f"aiayn check: {len(problems)} problem(s) in {params}", err=True)
        raise typer.Exit(2)
    typer.echo(f"{params}: ok")
    note = fetch_note(params, root)
    if note:
        typer.echo(note, err=True)


@app.command()
def fetch(
    mirror: Annotated[Optional[Path], typer.Option(help="Copy from this folder instead of downloading (env AIAYN_DATA_MIRROR).")] = None,
    root: RootOpt = Path("."),
    tok_references: Annotated[bool, typer.Option(
        help="Also download the dataset's lowercased, Moses-tokenized test references (data/multi30k/tok/, "
             "fairseq/Wu et al. 2021 BLEU: evaluate.moses_bleu); needs the internet.")] = False,
) -> None:
    """Download (or copy from a mirror) the Multi30k corpus into data/multi30k, verifying SHA-256."""
    setup_logging()
    from aiayn.stages import fetch as fetch_stage

    try:
        summary = fetch_stage.run(Layout(root), mirror=mirror)
        if tok_references:
            from aiayn.config.schema import load_params
            from aiayn.evaluation.moses_bleu import fetch_tok_references

            d = load_params(Path(root) / "params.yaml").data
            got = fetch_tok_references(Layout(root).raw, d.test_splits, (d.tgt_lang,))
            summary["tok_references"] = [p.name for p in got]
    except (OSError, ValueError) as e:
        typer.echo(f"aiayn fetch: error: {e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(json.dumps(summary, indent=2, default=str))


class _Output:
    """Translated lines to standard output (UTF-8 whatever the locale, flushed per chunk) or, with
    ``-o``, to a temporary sibling renamed onto the path at the end (complete or absent).

    A chunk's write, flush and count run with Ctrl-C deferred (``_deferred_sigint``), so
    ``written`` is exact when ``KeyboardInterrupt`` arrives; a second Ctrl-C during a write that
    blocks (a reader that stopped reading) interrupts at once and sets ``partial``.
    """

    def __init__(self, path: Optional[Path], stack: contextlib.ExitStack) -> None:
        self.written = 0
        self.partial = False
        if path is None:
            self.stream = sys.stdout.buffer
        else:
            from aiayn.io import atomic_path

            self.stream = stack.enter_context(open(stack.enter_context(atomic_path(path)), "wb"))

    def write(self, lines: list[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        self.partial = True
        with _deferred_sigint():
            self.stream.write(data)
            self.stream.flush()
            self.written += len(lines)
            self.partial = False


@contextlib.contextmanager
def _deferred_sigint():
    """Hold a SIGINT that arrives inside the block until its end (a second one raises at once).

    Main thread only, and not when SIGINT is ignored (a background job): then nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    pending: list[int] = []

    def handler(signum, frame) -> None:
        if pending:
            raise KeyboardInterrupt
        pending.append(signum)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt


def _stdout_gone() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


@app.command()
def translate(
    input: Annotated[Optional[Path], typer.Argument(help="One sentence per line ('\\n' or '\\r\\n' ends a line); '-' or absent: standard input.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write translations here, atomically (default: stdout, streamed).")] = None,
    model_dir: Annotated[Path, typer.Option(help="Model bundle (model.json, model.safetensors, spm.model).")] = Path("artifacts/model"),
    bundle: Annotated[Optional[Path], typer.Option(help="Use this serving bundle (artifacts/export: CTranslate2 or eager) and its decoding options, as `aiayn serve` does.")] = None,
    checkpoint: Annotated[Optional[Path], typer.Option(help="Use these weights instead (a .safetensors or a ckpt_*.json).")] = None,
    params: Annotated[Optional[Path], typer.Option("--params", "-p", help="params.yaml whose evaluate block gives the "
                                                   "decoding defaults, as the evaluate stage decoded (default: "
                                                   "./params.yaml when present, else the built-in defaults; a "
                                                   "--bundle brings its own).")] = None,
    beam_size: Annotated[Optional[int], typer.Option(min=1, help="1 = greedy. [default: evaluate.beam_size]")] = None,
    len_penalty: Annotated[Optional[float], typer.Option(min=0.0, help="[default: evaluate.len_penalty]")] = None,
    max_len_a: Annotated[Optional[float], typer.Option(min=0.0, help="[default: evaluate.max_len_a]")] = None,
    max_len_b: Annotated[Optional[int], typer.Option(min=1, help="[default: evaluate.max_len_b]")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(
        min=16, help="Source tokens per batch. [default: evaluate.max_tokens]")] = None,
    nbest: Annotated[int, typer.Option("--nbest", min=1, help="Write the N best translations of each line (at most --beam-size), each as `LINE<TAB>translation` (LINE: 0-based input line).")] = 1,
    scores: Annotated[bool, typer.Option("--scores", help="Put each translation's score (length-normalised log-probability) and a tab before it.")] = False,
    signals: Annotated[bool, typer.Option("--signals", help="Implies --scores; between the score and the translation, the answer's "
                                          "output signals as 7 tab-separated fields: " + ", ".join(SIGNAL_FIELDS) + " "
                                          "(docs/monitoring.md; empty for a blank line).")] = False,
    interactive: Annotated[bool, typer.Option("--interactive", help="Translate each line as soon as it is read (the default when standard input is a terminal).")] = False,
    long: Annotated[Literal["error", "truncate", "split"], typer.Option(
        "--long", help="A line longer than the model accepts: split it at sentence/clause/word boundaries, "
                       "truncate it (with a warning), or stop with an error naming it.")] = "split",
    encoding_errors: Annotated[Literal["strict", "replace"], typer.Option(
        "--encoding-errors", help="Invalid UTF-8: stop naming the line and byte (strict) or translate with "
                                  "U+FFFD (replace).")] = "strict",
    device: Annotated[str, typer.Option(help="auto (CUDA when available), cpu, cuda or cuda:N.")] = "auto",
) -> None:
    """Translate sentences (one per line) with the pipeline's latest model: one output line per input line.

    Blank lines stay blank; characters the model does not know are left out (one warning); long
    lines follow --long. Output is written per batch in input order; interactively (a terminal, or
    --interactive), per line as each is entered. Exit status: 0, 2 (bad input, model or option:
    one-line message, nothing written), 130 (Ctrl-C), 141 (stdout closed).
    """
    setup_logging(logging.WARNING)
    overrides = {"beam_size": beam_size, "len_penalty": len_penalty, "max_len_a": max_len_a, "max_len_b": max_len_b,
                 "max_tokens": max_tokens}
    if interactive and input not in (None, Path("-")):
        _fail(ValueError("--interactive translates standard input: leave out the input file"))
    interactive = interactive or (input in (None, Path("-")) and sys.stdin.isatty())
    out: Optional[_Output] = None
    try:
        with contextlib.ExitStack() as stack:
            translator, options = _open_translator(model_dir, bundle, checkpoint, device, overrides, nbest, params)
            decode = _answers(translator, options, nbest=nbest, scores=scores,
                              signals=_signal_scorer(bundle, params) if signals else None)
            write = _line_writer(nbest, scores or signals, signals)
            if interactive:
                out = _Output(output, stack)
                _translate_interactive(translator, options, out, write, decode, long=long, errors=encoding_errors)
                return
            try:
                if input is None or str(input) == "-":
                    data, source = sys.stdin.buffer.read(), "<stdin>"
                else:
                    data, source = input.read_bytes(), str(input)
                from aiayn.inference.text import read_input

                lines = read_input(data, errors=encoding_errors, source=source)
                prepared = translator.prepare(lines, options, long=long)
                out = _Output(output, stack)
            except (OSError, ValueError) as e:
                _fail(e)
            _write_chunks(decode(prepared, options.max_tokens), out, write, len(lines), stack)
    except KeyboardInterrupt:
        if output is None:
            done = f"{out.written if out else 0} line(s) written to stdout"
            if out is not None and out.partial:
                done += " (and part of the next batch)"
        else:
            done = f"nothing written to {output}"
        typer.echo(f"aiayn translate: interrupted; {done}", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:
        _stdout_gone()
        raise typer.Exit(EXIT_BROKEN_PIPE) from None


@app.command(name="export-hf")
def export_hf(
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write (replaced atomically).")],
    model_dir: Annotated[Path, typer.Option(help="Model bundle (model.json, model.safetensors, spm.model).")] = Path("artifacts/model"),
    params: Annotated[Optional[Path], typer.Option("--params", "-p", help="params.yaml whose evaluate block gives the "
                                                   "decoding defaults and data block the languages (default: "
                                                   "./params.yaml when present, else the built-in defaults).")] = None,
) -> None:
    """Export the model to the Hugging Face Marian format (transformers, ct2-transformers-converter, MLflow).

    The folder loads offline with ``transformers.pipeline("translation_<src>_to_<tgt>", model=DIR)``.
    Exit status 2 with a one-line message for a missing bundle or a model Marian cannot express.
    """
    setup_logging()
    from aiayn.checkpoint import CheckpointError
    from aiayn.config.schema import ConfigError
    from aiayn.inference.runtimes import DecodeOptions
    from aiayn.export.hf_marian import MarianExportError, export_marian

    try:
        p = _params_or_defaults(params)
        decode = DecodeOptions.from_eval(p.evaluate)
        out = export_marian(model_dir, output, decode=decode, src_lang=p.data.src_lang, tgt_lang=p.data.tgt_lang)
    except (ConfigError, FileNotFoundError, MarianExportError, CheckpointError, ValueError) as err:
        typer.echo(f"aiayn export-hf: error: {' '.join(str(err).split())}", err=True)
        raise typer.Exit(2) from None
    typer.echo(str(out))


def _fail(e: BaseException) -> None:
    """``aiayn translate``'s one-line error, exit status 2."""
    typer.echo(f"aiayn translate: error: {' '.join(str(e).split())}", err=True)
    raise typer.Exit(2) from None


def _params_or_defaults(params: Optional[Path]):
    """``--params``, else ``./params.yaml`` when present, else the built-in ``Params()``; ``ConfigError`` when the
    file does not load."""
    from aiayn.config.schema import Params, load_params

    if params is None and not Path("params.yaml").is_file():
        return Params()
    return load_params(params if params is not None else Path("params.yaml"))


def _open_translator(model_dir: Path, bundle: Optional[Path], checkpoint: Optional[Path], device: str,
                     overrides: dict, nbest: int, params: Optional[Path] = None):
    """``(Translator, DecodeOptions)`` before any input is read: the trained model folder decoded eagerly with
    the ``evaluate`` block of ``params`` (``_params_or_defaults``), or a serving bundle (its runtime and decoding
    options, ``aiayn.inference.load.BundlePredictor``); options given on the command line win. Bad model, params or
    option: ``_fail``."""
    from dataclasses import replace

    from aiayn.checkpoint import CheckpointError
    from aiayn.inference.runtimes import DecodeOptions
    from aiayn.tokenizer import TokenizerError

    try:
        if bundle is not None:
            if checkpoint is not None:
                raise ValueError("--checkpoint and --bundle exclude each other (a bundle holds its own weights)")
            from aiayn.inference.artifacts import resolve_device
            from aiayn.inference.load import BundlePredictor

            predictor = BundlePredictor(bundle, device=resolve_device(device).type, threads=len(os.sched_getaffinity(0)))
            translator, options = predictor.translator, predictor.options
        else:
            from aiayn.inference.translator import Translator

            options = DecodeOptions.from_eval(_params_or_defaults(params).evaluate)
            translator = Translator.from_dir(model_dir, weights=checkpoint, device=device)
        options = replace(options, **{k: v for k, v in overrides.items() if v is not None})
        if nbest > options.beam_size:
            raise ValueError(f"--nbest {nbest} needs --beam-size {nbest} or more (beam size {options.beam_size})")
    except (OSError, ValueError, TokenizerError, CheckpointError) as e:
        _fail(e)
    return translator, options


def _signal_scorer(bundle: Optional[Path], params: Optional[Path]):
    """``(LanguageScorer, target language)`` for ``--signals`` (``aiayn.cli.translate_output.target_lang``); a params
    file that does not load: ``_fail``."""
    from aiayn.cli.translate_output import target_lang
    from aiayn.config.schema import ConfigError
    from aiayn.quality.signals import LanguageScorer

    try:
        lang = target_lang(bundle, lambda: _params_or_defaults(params).data.tgt_lang)
    except (ConfigError, OSError, ValueError) as e:
        _fail(e)
    return LanguageScorer(), lang


def _line_writer(nbest: int, scores: bool, signals: bool = False):
    """How one input line's ``ScoredLine`` list (or plain text) becomes output lines (``--nbest``, ``--scores``,
    ``--signals``: ``aiayn.cli.translate_output.Signed`` answers)."""
    from aiayn.cli.translate_output import signal_fields

    def lines(index: int, hyps) -> list[str]:
        if isinstance(hyps, str):
            return [hyps]
        head = f"{index}\t" if nbest > 1 else ""
        if not scores:
            return [f"{head}{h.text}" for h in hyps]
        return [f"{head}{h.score:.6f}\t{signal_fields(h) if signals else ''}{h.text}" for h in hyps]

    return lines


def _write_chunks(chunks, out: "_Output", write, total: int, stack: contextlib.ExitStack) -> None:
    """Write each chunk's lines as it comes (a progress bar on a terminal for 50 lines or more)."""
    bar = task = None
    if total >= 50 and sys.stderr.isatty():
        from rich.progress import Progress

        bar = stack.enter_context(Progress(transient=True))
        task = bar.add_task("translate", total=total)
    index = 0
    for chunk in chunks:
        out.write([line for k, hyps in enumerate(chunk, index) for line in write(k, hyps)])
        index += len(chunk)
        if bar is not None:
            bar.advance(task, len(chunk))


def _translate_interactive(translator, options, out: "_Output", write, decode, *, long: str, errors: str) -> None:
    """Read standard input one line at a time and write each line's translation at once (never waits
    for the end of the input). A line that cannot be translated (bad bytes, too long under
    ``--long error``) gets an empty output line and one error line on stderr; the session goes on."""
    from aiayn.inference.text import InputError, read_input
    from aiayn.inference.translator import ScoredLine

    if sys.stdin.isatty():
        typer.echo("aiayn translate: type one sentence per line; Ctrl-D ends", err=True)
    for index, raw in enumerate(iter(sys.stdin.buffer.readline, b"")):
        try:
            lines = read_input(raw, errors=errors, source=f"<stdin line {index + 1}>") or [""]
            prepared = translator.prepare(lines, options, long=long)
            hyps = next(decode(prepared))[0]
        except (InputError, ValueError) as e:
            typer.echo(f"aiayn translate: line {index + 1}: error: {' '.join(str(e).split())}", err=True)
            hyps = [ScoredLine("", 0.0)]
        out.write(write(index, hyps))


@app.command()
def presets(vocab_size: Annotated[int, typer.Option(help="Shared vocabulary (WMT14 En-De: 37000 BPE).")] = 37000) -> None:
    """Print each model preset's hyperparameters and parameter count."""
    from rich.console import Console
    from rich.table import Table

    from aiayn.config.schema import MODEL_PRESETS, model_preset
    from aiayn.model import Transformer

    table = Table("preset", "d_model", "n_heads", "d_ff", "n_layers", "dropout", "parameters")
    for name in MODEL_PRESETS:
        cfg = model_preset(name, vocab_size=vocab_size)
        n = Transformer(cfg, device="meta").num_parameters()
        table.add_row(name, str(cfg.d_model), str(cfg.n_heads), str(cfg.d_ff), str(cfg.n_layers), str(cfg.dropout), f"{n / 1e6:.1f}M")
    Console().print(table)


@app.command()
def serve(
    bundle: Annotated[Optional[Path], typer.Option(help="Serve this bundle folder (artifacts/export) instead of the registry.")] = None,
    model_uri: Annotated[str, typer.Option(help="models:/NAME@ALIAS in the MLflow registry (polled for alias moves).")] = "models:/aiayn-en-de@champion",
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow registry (default MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).")] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    max_batch_sentences: Annotated[int, typer.Option(help="Sentences per micro-batch.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(help="How long an open micro-batch waits for more requests (ms).")] = 5.0,
    workers: Annotated[int, typer.Option(help="Micro-batches decoding at once.")] = 1,
    threads: Annotated[int, typer.Option(help="CTranslate2 workers per batch (one thread each) / torch threads (eager bundle).")] = 1,
    max_sentences: Annotated[int, typer.Option(help="Sentences per request (more: 422).")] = 64,
    max_body_bytes: Annotated[int, typer.Option(help="Request body limit in bytes (more: 413).")] = 256 * 1024,
    max_request_tokens: Annotated[int, typer.Option(help="Source tokens per request after tokenization (more: 422).")] = 2048,
    body_timeout_s: Annotated[float, typer.Option(help="The whole request body must arrive within this (seconds; else 408).")] = 10.0,
    drain_s: Annotated[float, typer.Option(help="On SIGTERM, requests in flight get this long to finish (seconds).")] = 30.0,
    poll_s: Annotated[float, typer.Option(help="Registry alias polling interval in seconds (0: never).")] = 30.0,
    log_path: Annotated[Path, typer.Option(help="SQLite request log (WAL), read by the drift monitor.")] = Path("serving/requests.db"),
    log_url: Annotated[Optional[str], typer.Option(help="PostgreSQL request log shared by replicas, postgresql://USER:PASSWORD@HOST:PORT/DB (default env AIAYN_REQUEST_LOG_URL; else --log-path).")] = None,
    retention_days: Annotated[float, typer.Option(help="Delete logged requests older than this (days).")] = 30.0,
    prune_every_s: Annotated[Optional[float], typer.Option(help="How often retention runs (seconds; default a tenth of --retention-days, 1 s to 1 h).")] = None,
    scores: Annotated[bool, typer.Option("--scores/--no-scores", help="A score per translation in every answer (CTranslate2 bundles: one more teacher-forced pass, ~1.2x decode time; n_best answers are always scored).")] = True,
    output_signals: Annotated[bool, typer.Option("--output-signals/--no-output-signals", help="Compute each answer's output signals (aiayn.quality.signals), keep them in the request log and count flagged answers in /metrics; off: the answer alone is logged and the output check has nothing to judge.")] = True,
    output_reference: Annotated[Optional[Path], typer.Option(help="The drift monitor's output reference whose thresholds count flagged answers in /metrics (default: artifacts/monitor_reference/output_reference.json when it exists; a reference calibrated on another model is not used).")] = None,
) -> None:
    """Serve translations over HTTP (POST /translate) with micro-batching and a durable request log."""
    setup_logging()
    from aiayn.serving.schemas import listen
    from aiayn.config.settings import Settings

    if bundle is None and not model_uri.startswith("models:/"):
        typer.echo(f"aiayn serve: error: --model-uri must look like models:/NAME@ALIAS, got {model_uri!r}", err=True)
        raise typer.Exit(2)
    try:
        sock = listen(host, port)  # before the model loads: a taken port is one line, at once
    except OSError as e:
        typer.echo(f"aiayn serve: error: {e}", err=True)
        raise typer.Exit(2) from None
    from aiayn.serving.config import ServeConfig
    from aiayn.serving.app import serve as run_service

    cfg = ServeConfig(bundle=bundle, model_uri=model_uri, tracking_uri=tracking_uri, host=host, port=port,
                      max_batch_sentences=max_batch_sentences, max_wait_ms=max_wait_ms, workers=workers,
                      threads=threads, max_sentences=max_sentences, max_body_bytes=max_body_bytes,
                      max_request_tokens=max_request_tokens, body_timeout_s=body_timeout_s, drain_s=drain_s,
                      poll_s=poll_s, log_path=log_path, log_url=log_url or Settings.from_env().request_log_url,
                      retention_days=retention_days, prune_every_s=prune_every_s, scores=scores,
                      output_reference=output_reference, output_signals=output_signals)
    try:
        run_service(cfg, sock)
    except Exception as e:  # noqa: BLE001 - start-up failures (registry unreachable, bad bundle): one line
        typer.echo(f"aiayn serve: error: {type(e).__name__}: {e}", err=True)
        raise typer.Exit(2) from None


if __name__ == "__main__":
    main()
