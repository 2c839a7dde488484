"""Cross-field checks of ``params.yaml``, all at once, before any stage runs (``aiayn check``).

Each block of ``params.yaml`` validates itself when it loads (``aiayn.config.schema``); what no single block
can see is checked here: the quantize gate on a split that is not a test split (a 100k-step training
would end in a quantize error), test splits the corpus does not have for the pair, splits that are
the same split, a model vocabulary that contradicts the tokenizer's, checkpoint averaging over more
checkpoints than are kept, fp16 without CUDA, a serving preference that names no built variant, a
BLEU tokenizer the target language needs but this machine lacks, language ID for a language
py3langid does not know. ``check_params_file`` also reports every block that does not load (one line
per field), so a user sees every problem in one run. The pipeline flow and every stage run it first
(``load_checked``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from aiayn.config.schema import ConfigError, Params, params_from_dict

__all__ = ["check_params", "check_params_file", "fetch_note", "dvc_params_missing", "dvc_problems", "load_checked"]


def _problems(params: Params, root: Path | None) -> list[tuple[set[str], str]]:
    """``(sections involved, message)`` per problem."""
    from aiayn.data.sources import _resolve, available_splits, moses_languages, split_problems

    d, q, t = params.data, params.quantize, params.train
    out: list[tuple[set[str], str]] = []
    if q.gate_split not in d.test_splits:
        out.append(({"quantize", "data"}, f"quantize.gate_split {q.gate_split!r} is not one of data.test_splits "
                                          f"{list(d.test_splits)} (the quantize stage would fail after training)"))
    if d.src_lang == d.tgt_lang:
        out.append(({"data"}, f"data.src_lang and data.tgt_lang are both {d.src_lang!r}"))
    if d.valid_split in d.test_splits:
        out.append(({"data"}, f"data.valid_split {d.valid_split!r} is also a test split (scores on it would be tuned on)"))
    if d.train_split in (d.valid_split, *d.test_splits):
        out.append(({"data"}, f"data.train_split {d.train_split!r} is also a valid/test split"))
    if len(set(d.test_splits)) != len(d.test_splits):
        out.append(({"data"}, f"data.test_splits repeats a split: {list(d.test_splits)}"))
    stray = sorted(set(d.corpus.sacrebleu) - set(d.test_splits))
    if stray:
        out.append(({"data"}, f"data.corpus.sacrebleu names {stray}, which are not in data.test_splits"))
    no_folder = False  # a local corpus's folder missing (Multi30k and hub datasets have none to check)
    if d.corpus.kind != "multi30k" and not d.corpus.name and root is not None:
        no_folder = not _resolve(root, d.corpus.path).exists()
    if no_folder:  # one cause, one line: no split can be looked for in it
        out.append(({"data"}, f"data.corpus.path {d.corpus.path!r} does not exist (under {root})"))
    have = None if no_folder else available_splits(d, root)
    if have is not None:
        mapped = set(d.corpus.splits) if d.corpus.kind != "multi30k" else set()  # checked below, by their files
        lacking = [s for s in d.splits if s not in have and s not in mapped]
        if lacking:
            where = d.corpus.kind if d.corpus.kind == "multi30k" else f"the {d.corpus.kind} corpus in {d.corpus.path}"
            langs = moses_languages(d, root) if root is not None and not have else []  # only said when none
            out.append(({"data"}, f"{where} has no split {', '.join(lacking)} for {d.pair}; it has "
                                  f"{', '.join(have) or 'none'}" + (f" (its files' languages: {', '.join(langs)})"
                                                                     if langs else "")))
        if root is not None:  # the rest as the corpus stage finds it: mapped files, outside the folder, .gz twins
            out += [({"data"}, m) for m in split_problems(d, root, [s for s in d.splits if s not in lacking])]
    default_vocab = type(params.model).model_fields["vocab_size"].default  # what a resolved params dump writes
    if params.model.vocab_size not in (params.tokenize.vocab_size, default_vocab):
        out.append(({"model", "tokenize"}, f"model.vocab_size {params.model.vocab_size} differs from "
                                           f"tokenize.vocab_size {params.tokenize.vocab_size} (the model takes the "
                                           "tokenizer's: drop model.vocab_size)"))
    if params.model.max_side_tokens < 16:
        out.append(({"model"}, f"model.max_positions {params.model.max_positions} leaves "
                               f"{params.model.max_side_tokens} tokens per side"))
    if t.average_last > t.keep_checkpoints:
        out.append(({"train"}, f"train.average_last {t.average_last} > train.keep_checkpoints {t.keep_checkpoints}: "
                               "averaging needs that many checkpoints kept"))
    if t.precision == "fp16" and t.device == "cpu":
        out.append(({"train"}, "train.precision fp16 needs CUDA, but train.device is cpu"))
    if not set(q.serving_preference) & set(q.variants):
        out.append(({"quantize"}, f"quantize.serving_preference {list(q.serving_preference)} names no variant of "
                                  f"quantize.variants {list(q.variants)}: the eager model would always ship"))
    out += _dependency_problems(params)
    out += _init_from_problems(params, root)
    return out


def _init_from_problems(params: Params, root: Path | None) -> list[tuple[set[str], str]]:
    """``train.init_from``: a parent folder that cannot be loaded, a model block that contradicts the parent's
    architecture (a folder's ``model.json``; for a registered version, the parent the tokenize stage recorded,
    since resolving one needs the registry: the tokenize stage checks it then), a replay pair that is missing."""
    t = params.train
    if t.init_from is None:
        return []
    from aiayn.config.finetune import is_registry_uri
    from aiayn.init_from import ParentModelError, architecture_problem, open_parent, recorded_parent
    from aiayn.stages import Layout

    out: list[tuple[set[str], str]] = []
    parent_model = None
    if not is_registry_uri(t.init_from) and (root is not None or Path(t.init_from).is_absolute()):
        folder = Path(t.init_from) if Path(t.init_from).is_absolute() else Path(root or ".") / t.init_from
        try:
            parent_model = open_parent(folder, t.init_from, digests=False).model
        except ParentModelError as e:
            out.append(({"train"}, str(e)))
    elif root is not None and (recorded := recorded_parent(Layout(root).tokenized)) and recorded["uri"] == t.init_from:
        parent_model = recorded["model"]
    if parent_model is not None and (problem := architecture_problem(params.model, parent_model, t.init_from)):
        out.append(({"train", "model"}, problem))
    ft, d = t.finetune, params.data
    if ft.replay_share > 0 and ft.replay_path and root is not None:
        prefix = Path(ft.replay_path) if Path(ft.replay_path).is_absolute() else root / ft.replay_path
        lacking = [f"{ft.replay_path}.{lang}" for lang in (d.src_lang, d.tgt_lang)
                   if not prefix.with_name(f"{prefix.name}.{lang}").is_file()]
        if lacking:
            out.append(({"train", "data"}, f"train.finetune.replay_path: {', '.join(lacking)} not found (under {root})"))
    return out


def _dependency_problems(params: Params) -> list[tuple[set[str], str]]:
    """What this machine must have for the pair: the BLEU tokenizer, the language-ID model's languages."""
    from aiayn.evaluation.scoring import ScoringError, bleu_tokenizer

    d, out = params.data, []
    try:
        bleu_tokenizer(d.tgt_lang, params.evaluate.bleu_tokenize)
    except ScoringError as e:
        out.append(({"data", "evaluate"}, str(e)))
    if d.langid:
        from aiayn.data.hygiene import LanguageId

        unknown = sorted({d.src_lang, d.tgt_lang} - set(LanguageId.labels()))
        if unknown:
            out.append(({"data"}, f"data.langid: py3langid does not identify {unknown}"))
    return out


def check_params(params: Params, root: str | Path | None = None) -> list[str]:
    """Every cross-field problem of ``params``, one line each (empty: none).

    With ``root`` (the project root), local corpus folders are looked at too (their splits, that
    they exist). Pure otherwise: no network, nothing written.
    """
    return [message for _, message in _problems(params, Path(root) if root is not None else None)]


def _error_lines(e: ConfigError, section: str) -> list[str]:
    cause = e.__cause__
    if isinstance(cause, ValidationError):
        lines = []
        for err in cause.errors():
            loc = ".".join(str(x) for x in err["loc"])
            field = loc if loc.startswith(section) else f"{section}.{loc}" if loc else section
            lines.append(f"{field}: {err['msg'].removeprefix('Value error, ')}")
        return lines
    return [str(e)]


def check_params_file(path: str | Path, root: str | Path | None = None) -> list[str]:
    """Every problem of the params file at ``path``: blocks that do not load (each field), then the
    cross-field checks among the blocks that did. Empty list: the file is fine."""
    path = Path(path)
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"params file not found: {path}"]
    except yaml.YAMLError as e:
        return [f"{path}: not valid YAML: {' '.join(str(e).split())}"]
    if raw is not None and not isinstance(raw, dict):
        return [f"{path}: top level must be a mapping, got {type(raw).__name__}"]
    raw = raw or {}
    try:
        return check_params(params_from_dict(raw), root)
    except ConfigError:
        pass
    problems, good, bad = [], {}, set()
    for section, value in raw.items():
        try:
            params_from_dict({section: value})
            good[section] = value
        except ConfigError as e:
            problems += _error_lines(e, section)
            bad.add(section)
    try:
        params = params_from_dict(good)
    except ConfigError as e:  # blocks that load alone but not together
        return problems + [str(e)]
    return problems + [m for sections, m in _problems(params, Path(root) if root else None) if not sections & bad]


def fetch_note(path: str | Path, root: str | Path) -> str | None:
    """One line for ``aiayn check`` when the params at ``path`` read Multi30k from a folder under ``root``
    that holds nothing yet: not a problem (``aiayn fetch`` fills it, and ``make run`` fetches first), but
    what a new user running the stages one by one needs next. None otherwise (or when the file does not load:
    its problems are said instead)."""
    try:
        params = params_from_dict(yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {})
    except (OSError, yaml.YAMLError, ConfigError, AttributeError):
        return None
    from aiayn.data.sources import _resolve  # the corpus stage's reading of data.corpus.path

    corpus = params.data.corpus
    folder = _resolve(Path(root), corpus.path)
    try:
        if corpus.kind != "multi30k" or folder.is_file() or (folder.is_dir() and any(folder.iterdir())):
            return None
    except OSError:  # unreadable: the corpus stage says so, with its own message
        return None
    return (f"note: {corpus.path} holds no Multi30k yet: `aiayn fetch` puts it there (`--mirror DIR` or "
            "$AIAYN_DATA_MIRROR for a local copy); `make run` fetches it first")


def dvc_params_missing(raw: Any, dvc_yaml: str | Path) -> list[tuple[str, str]]:
    """The ``params:`` keys of ``dvc_yaml``'s stages that the params mapping ``raw`` lacks, as
    ``(stage, key)``: DVC refuses to run such a stage ("Parameters ... are missing from
    'params.yaml'"), after the stages before it ran. A key present with a null value is fine for DVC;
    entries naming another params file are skipped. No ``dvc_yaml`` file: nothing to check."""
    path = Path(dvc_yaml)
    if not path.is_file():
        return []
    stages = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("stages") or {}
    absent, missing = object(), []
    for name, stage in stages.items():
        for key in (stage or {}).get("params", []):
            if not isinstance(key, str):  # {other_file.yaml: [...]}: another file's keys
                continue
            node = raw
            for part in key.split("."):
                node = node.get(part, absent) if isinstance(node, dict) else absent
            if node is absent:
                missing.append((name, key))
    return missing


def dvc_problems(path: str | Path, root: str | Path) -> list[str]:
    """``aiayn check``'s line for the keys ``<root>/dvc.yaml``'s stages name that the params file at ``path``
    lacks (``dvc_params_missing``); empty when it has them all, or when the file does not load (the other
    checks say why). Not part of ``load_checked``: ``aiayn <stage>`` runs without DVC and its keys."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []
    missing = dvc_params_missing(raw if isinstance(raw, dict) else {}, Path(root) / "dvc.yaml")
    if not missing:
        return []
    keys, stages = sorted({key for _, key in missing}), sorted({stage for stage, _ in missing})
    return [f"missing {', '.join(keys)}, which dvc.yaml's stage(s) {', '.join(stages)} name: `dvc repro` refuses "
            "to run them (the shipped params.yaml has every key; copy the ones you lack)"]


def load_checked(path: str | Path, root: str | Path | None = None) -> Params:
    """``load_params(path)`` after ``check_params_file``: what a stage runs on.

    Raises ``ConfigError`` listing every problem (``"<path>: N problem(s): a; b"``).
    """
    problems = check_params_file(path, root)
    if problems:
        raise ConfigError(f"{path}: {len(problems)} problem(s) (`aiayn check`): " + "; ".join(problems))
    from aiayn.config.schema import load_params

    return load_params(path)
