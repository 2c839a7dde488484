"""Corpus sources: every local format, Hugging Face datasets and sacreBLEU test sets through the
corpus and prepare stages; the hygiene report; every bad-input case; the config checks; the pair's
registered model name; the WMT14 config on a local stand-in of its Hugging Face schema."""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from aiayn.config.checks import check_params, check_params_file
from aiayn.config.schema import ConfigError, DataConfig, Params, params_from_dict, registered_model_name
from aiayn.data.readers import CorpusError
from aiayn.data.sources import SOURCE_FILE, SUMS_FILE, multi30k_splits
from aiayn.io import sha256_file
from aiayn.recording import NullRun
from aiayn.stages import Layout
from aiayn.stages import corpus as corpus_stage
from aiayn.stages import prepare as prepare_stage

REPO = Path(__file__).resolve().parents[1]

# A small parallel corpus; the test sentences are distinct from train except where a test says so.
TRAIN = [(f"a dog number {i} runs in the park", f"ein hund nummer {i} rennt im park") for i in range(30)]
VAL = [(f"the cat {i} sleeps", f"die katze {i} schläft") for i in range(5)]
TEST = [(f"two birds {i} sing", f"zwei vögel {i} singen") for i in range(6)]


def _write(path: Path, lines: list[str], gz: bool = False) -> Path:
    data = "".join(x + "\n" for x in lines).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def _params(corpus: dict, **data) -> Params:
    return params_from_dict({"data": {"corpus": corpus, "valid_split": "val", "test_splits": ["test"], **data},
                             "quantize": {"gate_split": "test"}})


def _moses(folder: Path, splits: dict[str, list[tuple[str, str]]], gz: bool = False) -> Path:
    for split, pairs in splits.items():
        _write(folder / f"{split}.en{'.gz' if gz else ''}", [s for s, _ in pairs], gz)
        _write(folder / f"{split}.de{'.gz' if gz else ''}", [t for _, t in pairs], gz)
    return folder


def _tsv(folder: Path, splits: dict[str, list[tuple[str, str]]], header: list[str] | None = None) -> Path:
    for split, pairs in splits.items():
        rows = (["\t".join(header)] if header else []) + [
            "\t".join({"en": s, "de": t, "id": str(i)}[c] for c in (header or ["en", "de"])) for i, (s, t) in enumerate(pairs)]
        _write(folder / f"{split}.tsv", rows)
    return folder


def _jsonl(folder: Path, splits: dict[str, list[tuple[str, str]]]) -> Path:
    for split, pairs in splits.items():
        _write(folder / f"{split}.jsonl", [json.dumps({"translation": {"en": s, "de": t}}, ensure_ascii=False)
                                           for s, t in pairs])
    return folder


def _run(params: Params, root: Path) -> tuple[dict, dict]:
    layout = Layout(root)
    corpus_stage.run(params, layout)
    summary = prepare_stage.run(params, layout)
    return summary, json.loads(layout.prepare_report.read_text())


def _prepared(root: Path, split: str) -> list[tuple[str, str]]:
    p = Layout(root).prepared
    return list(zip((p / f"{split}.en").read_text("utf-8").splitlines(), (p / f"{split}.de").read_text("utf-8").splitlines()))


SPLITS = {"train": TRAIN, "val": VAL, "test": TEST}


# --------------------------------------------------------------------------- every format


@pytest.mark.parametrize("fmt", ["moses", "moses-gz", "tsv", "tsv-header", "tsv-columns", "jsonl"])
def test_each_local_format_gives_the_same_prepared_text(tmp_path, fmt):
    folder = tmp_path / "corpus"
    corpus: dict = {"kind": fmt.split("-")[0], "path": str(folder)}
    if fmt.startswith("moses"):
        _moses(folder, SPLITS, gz=fmt == "moses-gz")
    elif fmt == "tsv":
        _tsv(folder, SPLITS)
    elif fmt == "tsv-header":
        _tsv(folder, SPLITS, header=["id", "de", "en"])
        corpus["header"] = True
    elif fmt == "tsv-columns":
        for split, pairs in SPLITS.items():  # no header row: the names come from the config
            _write(folder / f"{split}.tsv", [f"{t}\t{i}\t{s}" for i, (s, t) in enumerate(pairs)])
        corpus["columns"] = ["de", "id", "en"]
    else:
        _jsonl(folder, SPLITS)
    root = tmp_path / "proj"
    summary, report = _run(_params(corpus), root)
    for split, pairs in SPLITS.items():
        assert _prepared(root, split) == pairs
        assert summary[split]["read"] == summary[split]["kept"] == len(pairs)
    manifest = json.loads((Layout(root).corpus / SOURCE_FILE).read_text())
    assert manifest["identity"] == {"kind": corpus["kind"], "pair": "en-de", "path": str(folder)} == report["corpus"]
    sums = dict(reversed(line.split("  ")) for line in (Layout(root).corpus / SUMS_FILE).read_text().splitlines())
    for name, digest in sums.items():  # the snapshot is checksummed, and a byte copy of the user's files
        assert sha256_file(Layout(root).corpus / name) == digest
    first = manifest["splits"]["train"]
    assert sha256_file(Layout(root).corpus / first["files"][0]) == sha256_file(first["origin"][0])


def test_moses_per_split_prefixes_and_sacrebleu_test_set(tmp_path, monkeypatch):
    """``splits`` points a split anywhere; a sacreBLEU test set (read from its cache, no network) is a test split."""
    from sacrebleu.dataset import DATASETS

    _moses(tmp_path / "a", {"train": TRAIN})
    _moses(tmp_path / "a" / "b", {"dev": VAL})
    wmt = DATASETS["wmt14"]
    cache = tmp_path / "sacrebleu"
    monkeypatch.setattr(wmt, "_outdir", str(cache / "wmt14"))
    monkeypatch.setattr(wmt, "_rawdir", str(cache / "wmt14" / "raw"))
    for field in wmt.fieldnames("en-de"):  # what sacreBLEU leaves in its cache after a download
        lines = {"src": [s for s, _ in TEST], "ref": [t for _, t in TEST]}.get(field, ["x"] * len(TEST))
        _write(Path(wmt._get_txt_file_path("en-de", field)), lines)
    params = _params({"kind": "moses", "path": str(tmp_path / "a"), "sacrebleu": {"test": "wmt14"},
                      "splits": {"val": str(tmp_path / "a" / "b" / "dev")}})
    _run(params, tmp_path / "proj")
    assert _prepared(tmp_path / "proj", "val") == VAL and _prepared(tmp_path / "proj", "test") == TEST
    manifest = json.loads((Layout(tmp_path / "proj").corpus / SOURCE_FILE).read_text())
    assert manifest["identity"]["sacrebleu"] == {"test": "wmt14"}
    assert manifest["splits"]["test"]["origin"][0].endswith("wmt14.en-de.src")


def test_sacrebleu_offline_or_unknown_is_one_line(tmp_path, monkeypatch):
    from sacrebleu.dataset import DATASETS

    from aiayn.data.hub import sacrebleu_files

    with pytest.raises(CorpusError, match="sacreBLEU has no test set 'wmt99'"):
        sacrebleu_files("wmt99", "en", "de")
    with pytest.raises(CorpusError, match=r"has no pair en-xx; it has \["):
        sacrebleu_files("wmt14", "en", "xx")
    wmt = DATASETS["wmt14"]
    monkeypatch.setattr(wmt, "_outdir", str(tmp_path / "empty"))
    monkeypatch.setattr(wmt, "maybe_download", lambda: (_ for _ in ()).throw(OSError("network unreachable")))
    with pytest.raises(CorpusError) as err:
        sacrebleu_files("wmt14", "en", "de")
    assert "could not be downloaded" in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- hygiene report


def test_hygiene_counts_each_rule_and_keeps_eval_splits(tmp_path):
    dirty = list(TRAIN[:10])
    dirty += [("   ", "leer"), ("a dog number 3 runs in the park", "ein hund nummer 3 rennt im park")]  # empty, duplicate
    dirty += [TEST[2]]  # a test source in train: contamination
    dirty += [("A man in a blue shirt is riding a bicycle down the street.",
               "A man in a blue shirt is riding a bicycle down the street.")]  # English on the German side
    dirty += [("bell\x07ring", "glocke")]
    _moses(tmp_path / "c", {"train": dirty, "val": VAL + VAL[:1], "test": TEST})  # val: one duplicate, kept
    params = _params({"kind": "moses", "path": str(tmp_path / "c")}, langid=True, min_words=1, max_ratio=9)
    summary, report = _run(params, tmp_path / "proj")
    dropped = summary["train"]["dropped"]
    assert (dropped["empty"], dropped["duplicate"], dropped["contaminated"], dropped["control_char"]) == (1, 1, 1, 1)
    assert dropped["langid_tgt"] >= 1 and summary["train"]["read"] == len(dirty)
    assert summary["train"]["read"] == summary["train"]["kept"] + sum(dropped.values())
    kept = _prepared(tmp_path / "proj", "train")
    assert TEST[2] not in kept and ("   ", "leer") not in kept and len(set(kept)) == len(kept)
    assert report["checks"]["val"]["duplicate"] == 1 and _prepared(tmp_path / "proj", "val") == VAL + VAL[:1]
    assert report["splits"] == summary and report["rules"]["langid"] is True
    metrics = prepare_stage.report_metrics(report)
    assert metrics["prepare.train.dropped.contaminated"] == 1 and metrics["prepare.val.found.duplicate"] == 1


class _SpyRun(NullRun):
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def log_metrics(self, metrics, step):
        super().log_metrics(metrics, step)  # MLflow's rules, as every recorder checks them
        self.calls.append(("metrics", dict(metrics), step))

    def log_artifact(self, path, artifact_path=None):
        super().log_artifact(path, artifact_path)
        self.calls.append(("artifact", Path(path), artifact_path))

    def set_tags(self, tags):
        super().set_tags(tags)
        self.calls.append(("tags", dict(tags)))


class _SpyRecorder:
    def __init__(self) -> None:
        self.calls: list = []

    @contextlib.contextmanager
    def start(self, record):
        self.calls.append(("start", record.stage))
        yield _SpyRun(self.calls)


def test_prepare_records_its_hygiene_counts_and_report(tmp_path):
    """The report is logged to the tracker (its own ``prepare`` run), not only a DVC metric."""
    dirty = list(TRAIN[:10]) + [("   ", "leer"), TEST[2]]
    _moses(tmp_path / "c", {"train": dirty, "val": VAL, "test": TEST})
    params = _params({"kind": "moses", "path": str(tmp_path / "c")})
    layout = Layout(tmp_path / "proj")
    corpus_stage.run(params, layout)
    spy = _SpyRecorder()
    prepare_stage.run(params, layout, spy)
    report = json.loads(layout.prepare_report.read_text())
    assert spy.calls[:3] == [("start", "prepare"), ("metrics", prepare_stage.report_metrics(report), 0),
                             ("artifact", layout.prepare_report, None)]
    tags = spy.calls[3][1]
    assert tags["data.corpus.kind"] == "moses" and tags["data.corpus.pair"] == "en-de", tags
    assert all(re.match(prepare_stage.RECORD.headline_tags, k) for k in tags)  # the pipeline run names the corpus
    assert spy.calls[1][1]["prepare.train.dropped.empty"] == 1 and spy.calls[1][1]["prepare.train.dropped.contaminated"] == 1


def test_multi30k_keeps_its_duplicates_other_corpora_drop_them(tmp_path):
    assert DataConfig().dedup_on is False  # the published Multi30k train split, whole: the main job unchanged
    assert DataConfig(corpus={"kind": "tsv", "path": "x"}).dedup_on is True
    assert DataConfig(corpus={"kind": "tsv", "path": "x"}, dedup=False).dedup_on is False


# --------------------------------------------------------------------------- bad input


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    _moses(tmp_path / "c", {"val": VAL, "test": TEST})
    _write(tmp_path / "c" / "train.en", [s for s, _ in TRAIN])
    _write(tmp_path / "c" / "train.de.gz", [t for _, t in TRAIN[:-2]], gz=True)
    with pytest.raises(CorpusError) as err:
        _run(_params({"kind": "moses", "path": str(tmp_path / "c")}), tmp_path / "proj")
    msg = str(err.value)
    assert str(tmp_path / "c" / "train.en") in msg and str(tmp_path / "c" / "train.de.gz") in msg
    assert "has 30 lines" in msg and "has 28" in msg and "blank" not in msg


@pytest.mark.parametrize("blanks", [1, 2])
def test_a_trailing_blank_line_is_named_as_such(tmp_path, blanks):
    """One file of a pair ending in an extra blank line is not reported as plain "misaligned: 5 lines but 6":
    the message points at the blank line(s) to delete; other extra lines are not called blank."""
    _moses(tmp_path / "c", {"val": VAL, "test": TEST})
    _write(tmp_path / "c" / "train.en", [s for s, _ in TRAIN])
    de = _write(tmp_path / "c" / "train.de", [t for _, t in TRAIN] + [" "] * blanks)
    with pytest.raises(CorpusError) as err:
        _run(_params({"kind": "moses", "path": str(tmp_path / "c")}), tmp_path / "proj")
    span = f"{de}:31" + (" is" if blanks == 1 else f"-{30 + blanks} are")
    assert str(err.value).endswith(f"has {30 + blanks}; {span} blank: delete the trailing blank line{'s' * (blanks > 1)}")


def test_tsv_row_with_wrong_column_count_names_file_and_line(tmp_path):
    _tsv(tmp_path / "c", SPLITS)
    path = tmp_path / "c" / "train.tsv"
    lines = path.read_text().splitlines()
    lines[6] += "\textra"
    _write(path, lines)
    with pytest.raises(CorpusError, match=re.escape(f"{path}:7: 3 tab-separated columns, expected 2")):
        _run(_params({"kind": "tsv", "path": str(tmp_path / "c")}), tmp_path / "proj")


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_file_line_and_byte(tmp_path, gz):
    _moses(tmp_path / "c", SPLITS)
    path = tmp_path / "c" / ("train.de.gz" if gz else "train.de")
    (tmp_path / "c" / "train.de").unlink()
    data = "".join(t + "\n" for _, t in TRAIN).encode().replace(b"nummer 4 ", b"nummer 4 \xff")
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(CorpusError, match=re.escape(f"{path}:5: invalid UTF-8 at byte 18 of the line")):
        _run(_params({"kind": "moses", "path": str(tmp_path / "c")}), tmp_path / "proj")


def test_jsonl_without_the_language_names_the_ones_it_has(tmp_path):
    _jsonl(tmp_path / "c", SPLITS)
    with pytest.raises(CorpusError, match=r"no 'fr' in \"translation\"; it has \['de', 'en'\]"):
        _run(_params({"kind": "jsonl", "path": str(tmp_path / "c")}, tgt_lang="fr"), tmp_path / "proj")


def test_tsv_header_without_the_language_names_the_columns(tmp_path):
    _tsv(tmp_path / "c", SPLITS, header=["id", "en", "de"])
    with pytest.raises(CorpusError, match=r"no column named 'fr'; the columns are \['id', 'en', 'de'\]"):
        _run(_params({"kind": "tsv", "path": str(tmp_path / "c"), "header": True}, tgt_lang="fr"), tmp_path / "proj")


def test_missing_split_names_what_was_tried_and_the_splits_there_are(tmp_path):
    _moses(tmp_path / "c", {"train": TRAIN, "val": VAL})
    with pytest.raises(CorpusError, match=r"no file for split 'test'.*has splits train, val"):
        _run(_params({"kind": "moses", "path": str(tmp_path / "c")}), tmp_path / "proj")


def test_a_split_mapped_outside_the_corpus_folder_is_refused_by_check_and_the_corpus_stage(tmp_path):
    """DVC's corpus stage depends on ``data.corpus.path`` alone, and the data version hashes that folder: a
    ``splits`` entry outside it would be read, but an edit to it would re-run nothing and be in no version."""
    _moses(tmp_path / "a", {"train": TRAIN, "test": TEST})
    _moses(tmp_path / "b", {"dev": VAL})
    params = _params({"kind": "moses", "path": str(tmp_path / "a"), "splits": {"val": str(tmp_path / "b" / "dev")}})
    problems = check_params(params, tmp_path)
    assert any("data.corpus.splits.val" in p and "outside data.corpus.path" in p for p in problems), problems
    with pytest.raises(CorpusError, match=r"data.corpus.splits.val .* is outside data.corpus.path"):
        _run(params, tmp_path / "proj")
    relative = _params({"kind": "moses", "path": str(tmp_path / "a"), "splits": {"val": "b/dev"}})
    assert any(f"'b/dev' (= {tmp_path / 'b' / 'dev'}: a relative path is the project root's)" in p
               for p in check_params(relative, tmp_path))
    _moses(tmp_path / "a" / "extra", {"dev": VAL})  # inside the folder DVC watches: fine
    inside = _params({"kind": "moses", "path": str(tmp_path / "a"),
                      "splits": {"val": str(tmp_path / "a" / "extra" / "dev")}})
    assert check_params(inside, tmp_path) == []
    _run(inside, tmp_path / "proj")
    assert _prepared(tmp_path / "proj", "val") == VAL


def test_check_still_names_a_multi30k_split_that_does_not_exist_when_splits_maps_it(tmp_path):
    params = _params({"kind": "multi30k", "path": "data/multi30k", "splits": {"dev": "val"}}, valid_split="dev",
                     test_splits=["test_2016_flickr"])  # Multi30k has no split mapping: "dev" is not one of its
    assert any("multi30k has no split dev" in p for p in check_params(params, tmp_path))


def test_check_names_the_languages_of_a_moses_folder_that_lacks_the_pair(tmp_path):
    _moses(tmp_path / "c", SPLITS)  # en and de
    problems = check_params(_params({"kind": "moses", "path": str(tmp_path / "c")}, tgt_lang="fr"), tmp_path)
    assert any("has no split train, val, test for en-fr; it has none (its files' languages: de, en)" in p
               for p in problems), problems


@pytest.mark.parametrize("kind", ["moses", "tsv", "jsonl"])
def test_check_says_a_missing_corpus_folder_once_not_also_as_missing_splits(tmp_path, kind):
    problems = check_params(_params({"kind": kind, "path": "nowhere/corpus"}), tmp_path)
    assert problems == [f"data.corpus.path 'nowhere/corpus' does not exist (under {tmp_path})"]


@pytest.mark.parametrize("kind", ["moses", "tsv"])
def test_check_names_the_files_tried_for_a_mapped_split_that_is_missing(tmp_path, kind):
    (_moses if kind == "moses" else _tsv)(tmp_path / "a", {"train": TRAIN, "test": TEST})
    target = str(tmp_path / "a" / ("nope" if kind == "moses" else "nope.tsv"))
    problems = check_params(_params({"kind": kind, "path": str(tmp_path / "a"), "splits": {"val": target}}), tmp_path)
    assert any("no file for split 'val'" in p and "nope" in p for p in problems), problems


def test_a_file_both_plain_and_gzipped_is_refused_not_chosen(tmp_path):
    """``train.en`` beside ``train.en.gz``: the user may have unpacked and edited one; which one is read must not
    be a silent rule."""
    _moses(tmp_path / "c", SPLITS)
    _write(tmp_path / "c" / "train.en.gz", [s.upper() for s, _ in TRAIN], gz=True)
    params = _params({"kind": "moses", "path": str(tmp_path / "c")})
    assert any("both" in p and "train.en.gz" in p for p in check_params(params, tmp_path))
    with pytest.raises(CorpusError, match=r"both .*train\.en and .*train\.en\.gz"):
        _run(params, tmp_path / "proj")


@pytest.mark.parametrize("case", ["val-is-test", "test-in-train"])
def test_splits_that_overlap_entirely_are_refused(tmp_path, case):
    folder = tmp_path / "c"
    if case == "val-is-test":
        _moses(folder, {"train": TRAIN, "val": TEST, "test": TEST})
        match = "splits val and test overlap entirely"
    else:
        _moses(folder, {"train": TRAIN + TEST, "val": VAL, "test": TEST})
        match = "test split test overlaps train entirely"
    with pytest.raises(CorpusError, match=match):
        _run(_params({"kind": "moses", "path": str(folder)}), tmp_path / "proj")
    assert not Layout(tmp_path / "proj").prepared.exists()


def test_empty_line_in_a_test_split_is_fatal_and_named(tmp_path):
    _moses(tmp_path / "c", {"train": TRAIN, "val": VAL, "test": TEST[:3] + [("", "leer")] + TEST[4:]})
    with pytest.raises(CorpusError, match=re.escape(f"{tmp_path / 'c' / 'test.en'}:4: empty line")):
        _run(_params({"kind": "moses", "path": str(tmp_path / "c")}), tmp_path / "proj")


@pytest.mark.parametrize("reference", ["@@", "ein @@ Hund", "\u2581ein \u2581Hund"])
def test_a_subword_marker_in_a_reference_is_refused_at_prepare_not_at_the_first_validation(tmp_path, reference):
    """The scorer refuses such a reference; prepare names it first, before any training."""
    _tsv(tmp_path / "c", {"train": TRAIN, "val": VAL[:2] + [(VAL[2][0], reference)] + VAL[3:], "test": TEST})
    with pytest.raises(CorpusError, match=re.escape(f"{tmp_path / 'c' / 'val.tsv'}:3: the reference contains a subword")):
        _run(_params({"kind": "tsv", "path": str(tmp_path / "c")}), tmp_path / "proj")


@pytest.mark.parametrize("fmt", ["jsonl-null", "jsonl-empty", "tsv"])
def test_an_empty_side_in_a_test_split_is_named_in_its_format_words(tmp_path, fmt):
    """A JSONL null or a TSV empty column is not an "empty line": name the field."""
    folder = tmp_path / "c"
    if fmt == "tsv":
        _tsv(folder, {"train": TRAIN, "val": VAL, "test": TEST[:1] + [(TEST[1][0], "")] + TEST[2:]})
        match = f"{folder / 'test.tsv'}:2: the 'de' column is empty (valid and test"
    else:
        _jsonl(folder, {"train": TRAIN, "val": VAL, "test": TEST})
        lines = (folder / "test.jsonl").read_text(encoding="utf-8").splitlines()
        lines[1] = json.dumps({"translation": {"en": TEST[1][0], "de": None if fmt == "jsonl-null" else ""}})
        _write(folder / "test.jsonl", lines)
        match = f'{folder / "test.jsonl"}:2: "translation".de is empty or null (valid and test'
    with pytest.raises(CorpusError, match=re.escape(match)):
        _run(_params({"kind": "tsv" if fmt == "tsv" else "jsonl", "path": str(folder)}), tmp_path / "proj")


def test_failing_prepare_leaves_the_previous_output_intact(tmp_path):
    folder = _moses(tmp_path / "c", SPLITS)
    root = tmp_path / "proj"
    params = _params({"kind": "moses", "path": str(folder)})
    _run(params, root)
    before = {p.name: p.read_bytes() for p in sorted(Layout(root).prepared.iterdir())}
    report_before = Layout(root).prepare_report.read_bytes()
    _write(folder / "train.de", [t for _, t in TRAIN[:-1]])  # now misaligned
    corpus_stage.run(params, Layout(root))
    with pytest.raises(CorpusError, match="misaligned"):
        prepare_stage.run(params, Layout(root))
    assert {p.name: p.read_bytes() for p in sorted(Layout(root).prepared.iterdir())} == before
    assert Layout(root).prepare_report.read_bytes() == report_before


def test_prepare_refuses_a_snapshot_of_another_corpus(tmp_path):
    _moses(tmp_path / "c", SPLITS)
    root = tmp_path / "proj"
    _run(_params({"kind": "moses", "path": str(tmp_path / "c")}), root)
    other = _params({"kind": "jsonl", "path": str(tmp_path / "c")})
    with pytest.raises(CorpusError, match="is not this corpus.*run `aiayn corpus`"):
        prepare_stage.run(other, Layout(root))


def test_multi30k_split_that_does_not_exist_names_the_ones_that_do(multi30k_mirror, tmp_path):
    assert multi30k_splits("en", "cs") == ("test_2016_flickr", "train", "val")
    assert multi30k_splits("en", "fr") == ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "train", "val")
    layout = Layout(tmp_path)
    shutil.copytree(multi30k_mirror, layout.raw)
    params = params_from_dict({"data": {"tgt_lang": "cs"}})
    with pytest.raises(CorpusError) as err:
        corpus_stage.run(params, layout)
    msg = str(err.value)
    assert "multi30k has no split test_2017_flickr, test_2017_mscoco for en-cs" in msg
    assert "it has test_2016_flickr, train, val" in msg and "aiayn fetch" not in msg


def test_multi30k_snapshot_is_verified_and_byte_identical(multi30k_mirror, tmp_path):
    layout = Layout(tmp_path)
    shutil.copytree(multi30k_mirror, layout.raw)
    params = params_from_dict({"data": {"tgt_lang": "fr", "max_train_pairs": 100}})
    summary = corpus_stage.run(params, layout)
    assert summary["identity"] == {"kind": "multi30k", "pair": "en-fr", "path": "data/multi30k"}
    for name in summary["splits"]["train"]:
        assert sha256_file(layout.corpus / name) == sha256_file(multi30k_mirror / name)
    corrupt = layout.raw / "val.fr.gz"
    corrupt.chmod(0o644)  # the mirror may be read-only (copytree keeps its modes)
    with open(corrupt, "ab") as f:
        f.write(b"\0")
    with pytest.raises(CorpusError, match=r"val.fr.gz: sha256 .*expected"):
        corpus_stage.run(params, layout)


def test_corpus_snapshot_is_the_same_bytes_wherever_the_project_is_cloned(multi30k_mirror, tmp_path):
    """The corpus stage's output (a DVC out every later stage depends on) must not depend on the clone's
    folder: two fresh-clone `make run`s in /home/runner/run1 and run2 got different `artifacts/corpus`
    hashes in dvc.lock because SOURCE.json recorded the raw files' absolute paths."""
    params = params_from_dict({"data": {"tgt_lang": "fr", "max_train_pairs": 100}})
    outputs = []
    for clone in ("run1", "elsewhere/run2"):
        layout = Layout(tmp_path / clone)
        shutil.copytree(multi30k_mirror, layout.raw)
        corpus_stage.run(params, layout)
        outputs.append({f.name: f.read_bytes() for f in sorted(layout.corpus.iterdir())})
        origin = json.loads((layout.corpus / SOURCE_FILE).read_text())["splits"]["train"]["origin"]
        assert origin == ["data/multi30k/train.en.gz", "data/multi30k/train.fr.gz"]  # relative to the project
    assert outputs[0] == outputs[1]


def test_a_corpus_given_by_a_relative_path_is_recorded_as_given_from_any_clone_folder(tmp_path, monkeypatch):
    """`data.corpus.path: ../corp` under `dvc repro` (an absolute project root) was logged and recorded in
    SOURCE.json as `/home/.../clone/../corp/train.en`: the corpus stage's bytes depended on the clone's
    folder and differed from `aiayn corpus`'s (a relative root). Recorded as given, `..` folded."""
    outputs = []
    for clone, root in (("x", None), ("y/deeper", "."), ("z", None)):
        _moses(tmp_path / clone / "corp", SPLITS)
        proj = tmp_path / clone / "proj"
        proj.mkdir(parents=True)
        monkeypatch.chdir(proj)
        _run(_params({"kind": "moses", "path": "../corp"}), Path(root) if root else proj)
        manifest = json.loads((proj / "artifacts" / "corpus" / SOURCE_FILE).read_text())
        assert manifest["splits"]["train"]["origin"] == ["../corp/train.en", "../corp/train.de"]
        outputs.append({f.name: f.read_bytes() for f in sorted((proj / "artifacts" / "corpus").iterdir())})
    assert outputs[0] == outputs[1] == outputs[2]


# --------------------------------------------------------------------------- Hugging Face datasets


@pytest.fixture
def hf_local(tmp_path, monkeypatch):
    """A dataset written locally in wmt14's schema (``translation: {de, en}``; train/validation/test), no hub."""
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})

    def split(pairs):
        return datasets.Dataset.from_dict({"translation": [{"en": s, "de": t} for s, t in pairs]}, features=features)

    path = tmp_path / "wmt14-standin"
    datasets.DatasetDict({"train": split(TRAIN), "validation": split(VAL), "test": split(TEST)}).save_to_disk(str(path))
    return path


def test_hf_dataset_saved_to_disk(hf_local, tmp_path):
    params = _params({"kind": "hf", "path": str(hf_local), "splits": {"val": "validation"}})
    _run(params, tmp_path / "proj")
    for split, pairs in SPLITS.items():
        assert _prepared(tmp_path / "proj", split) == pairs
    identity = json.loads((Layout(tmp_path / "proj").corpus / SOURCE_FILE).read_text())["identity"]
    assert identity["kind"] == "hf" and identity["path"] == str(hf_local) and identity["resolved_revision"] is None
    assert set(identity["fingerprints"]) == {"train", "validation", "test"}
    first = sha256_file(Layout(tmp_path / "proj").corpus / "train.jsonl.gz")
    shutil.rmtree(tmp_path / "proj" / "artifacts" / "corpus")
    corpus_stage.run(params, Layout(tmp_path / "proj"))  # the export is deterministic bytes (DVC hash stable)
    assert sha256_file(Layout(tmp_path / "proj").corpus / "train.jsonl.gz") == first


def test_hf_data_files_folder(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    folder = tmp_path / "files"
    for split, pairs in SPLITS.items():  # flat columns, one per language (not the translation shape)
        _write(folder / f"{split}.jsonl", [json.dumps({"en": s, "de": t}) for s, t in pairs])
    params = _params({"kind": "hf", "path": str(folder), "splits": {"val": "validation"}})  # datasets' name for val
    _run(params, tmp_path / "proj")
    assert _prepared(tmp_path / "proj", "test") == TEST


def test_hf_dataset_without_the_languages_names_what_it_has(hf_local, tmp_path):
    params = _params({"kind": "hf", "path": str(hf_local), "splits": {"val": "validation"}}, tgt_lang="fr")
    with pytest.raises(CorpusError, match=r"no language 'fr' in its \"translation\" column; it has \['de', 'en'\]"):
        corpus_stage.run(params, Layout(tmp_path / "proj"))
    params = _params({"kind": "hf", "path": str(hf_local)})  # no split "val" in the dataset
    with pytest.raises(CorpusError, match=r"has no split 'val' \(for val\); it has \['test', 'train', 'validation'\]"):
        corpus_stage.run(params, Layout(tmp_path / "proj"))
    assert not Layout(tmp_path / "proj").corpus.exists()


def test_hub_dataset_offline_is_one_line_saying_what_is_needed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    params = load_wmt14("base")
    with pytest.raises(CorpusError) as err:
        corpus_stage.run(params, Layout(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and "wmt/wmt14" in msg and "network access to the Hugging Face hub" in msg


# --------------------------------------------------------------------------- checks, configs, the pair


def load_wmt14(preset: str, **data_overrides) -> Params:
    raw = yaml.safe_load((REPO / "configs" / f"wmt14_{preset}.yaml").read_text())
    raw["data"] |= data_overrides
    return params_from_dict(raw)


def test_wmt14_configs_pass_the_check_and_the_old_one_did_not(tmp_path):
    for preset in ("base", "big"):
        assert check_params_file(REPO / "configs" / f"wmt14_{preset}.yaml", REPO) == []
        raw = yaml.safe_load((REPO / "configs" / f"wmt14_{preset}.yaml").read_text())
        assert {"data", "tokenize", "model", "train", "evaluate", "quantize", "monitor"} <= set(raw)
        assert raw["data"]["corpus"]["path"]  # dvc.yaml's ${data.corpus.path} resolves from the file itself
    old = yaml.safe_load((REPO / "configs" / "wmt14_base.yaml").read_text())
    del old["quantize"], old["monitor"], old["data"]["corpus"]  # a params file without these sections (an older wmt14_base.yaml)
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    problems = check_params_file(tmp_path / "old.yaml", REPO)
    assert any("quantize.gate_split 'test_2016_flickr' is not one of data.test_splits ['newstest2014']" in p
               for p in problems)
    assert any("multi30k has no split newstest2013, newstest2014" in p for p in problems)


def test_check_reports_every_problem_at_once(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({
        "data": {"tgt_lang": "cs"},
        "model": {"preset": "tiny", "vocab_size": 100},
        "train": {"grad_accum": 3, "nproc_per_node": 2, "distributed": "ddp"},
        "quantize": {"gate_split": "test_2017_flickr"},
        "evaluate": {"beam_size": 0},
    }))
    problems = check_params_file(tmp_path / "p.yaml")
    text = "\n".join(problems)
    assert "grad_accum=3 must be a multiple of train.nproc_per_node=2" in text
    assert "evaluate.beam_size" in text
    assert "multi30k has no split test_2017_flickr, test_2017_mscoco for en-cs; it has test_2016_flickr, train, val" in text
    assert "model.vocab_size 100 differs from tokenize.vocab_size 8000" in text
    # the gate check involves evaluate's block? no: quantize and data loaded, so it is reported too
    assert "quantize.gate_split 'test_2017_flickr'" not in text  # it IS a test split of the config (data loaded)
    assert len(problems) == 4, problems


def test_check_params_cross_fields():
    p = params_from_dict({"data": {"valid_split": "test_2016_flickr"}, "quantize": {"gate_split": "val"},
                          "train": {"average_last": 9, "keep_checkpoints": 3, "precision": "fp16", "device": "cpu"},
                          "evaluate": {"bleu_tokenize": "ja-mecab"}})
    text = "\n".join(check_params(p))
    for expected in ("quantize.gate_split 'val' is not one of data.test_splits",
                     "data.valid_split 'test_2016_flickr' is also a test split",
                     "train.average_last 9 > train.keep_checkpoints 3",
                     "train.precision fp16 needs CUDA",
                     "sacrebleu[ja]"):
        assert expected in text, (expected, text)
    assert check_params(Params()) == []


def test_aiayn_check_command(tmp_path):
    from typer.testing import CliRunner

    from aiayn.cli.main import app

    ok = CliRunner().invoke(app, ["check", "--params", str(REPO / "params.yaml"), "--root", str(REPO)])
    assert ok.exit_code == 0 and "ok" in ok.output
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"data": {"test_splits": ["newstest2014"]}}))
    bad = CliRunner().invoke(app, ["check", "--params", str(tmp_path / "p.yaml"), "--root", str(tmp_path)])
    assert bad.exit_code == 2
    assert "gate_split" in bad.output and "multi30k has no split newstest2014" in bad.output and "2 problem(s)" in bad.output
    # in a project with dvc.yaml, the keys its stages name that p.yaml lacks are a third problem
    in_repo = CliRunner().invoke(app, ["check", "--params", str(tmp_path / "p.yaml"), "--root", str(REPO)])
    assert in_repo.exit_code == 2 and "3 problem(s)" in in_repo.output and "`dvc repro` refuses" in in_repo.output


def test_stage_loader_refuses_a_config_with_problems(tmp_path):
    from aiayn.config.checks import load_checked

    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"data": {"test_splits": ["newstest2014"]}}))
    with pytest.raises(ConfigError, match=r"2 problem\(s\).*gate_split.*newstest2014"):
        load_checked(tmp_path / "p.yaml")


def test_registered_model_name_follows_the_pair():
    assert registered_model_name(DataConfig()) == "aiayn-en-de"
    assert registered_model_name(DataConfig(tgt_lang="fr")) == "aiayn-en-fr"
    assert registered_model_name(DataConfig(src_lang="de", tgt_lang="en")) == "aiayn-de-en"
    assert registered_model_name(DataConfig(tgt_lang="fr"), "my-model") == "my-model"
    with pytest.raises(ConfigError):
        registered_model_name(DataConfig(), " ")
    from aiayn.stages.export import REGISTERED_MODEL

    assert REGISTERED_MODEL == "aiayn-en-de"


def test_corpus_config_refuses_fields_of_other_kinds():
    with pytest.raises(ConfigError, match="needs path"):
        params_from_dict({"data": {"corpus": {"kind": "tsv"}}})
    with pytest.raises(ConfigError, match="apply to kind hf only"):
        params_from_dict({"data": {"corpus": {"kind": "moses", "path": "x", "revision": "abc"}}})
    with pytest.raises(ConfigError, match="apply to kind tsv only"):
        params_from_dict({"data": {"corpus": {"kind": "jsonl", "path": "x", "header": True}}})
    assert params_from_dict({"data": {"corpus": {"kind": "hf", "name": "wmt/wmt14"}}}).data.corpus.path == \
        "src/aiayn/data/hub.py"


def test_dvc_yaml_watches_the_corpus_path_and_reports_the_hygiene():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert "${data.corpus.path}" in stages["corpus"]["deps"] and "artifacts/corpus" in stages["corpus"]["outs"]
    assert "artifacts/corpus" in stages["prepare"]["deps"]
    assert {"artifacts/prepare_report.json": {"cache": False}} in stages["prepare"]["metrics"]
    assert list(stages)[:2] == ["corpus", "prepare"]


def test_wmt14_config_on_a_local_standin(hf_local, tmp_path, monkeypatch):
    """configs/wmt14_base.yaml as shipped, its source pointed at a local dataset of wmt14's schema and its
    sizes shrunk, through corpus -> prepare -> tokenize -> a few train steps -> evaluate."""
    from aiayn.stages import evaluate as evaluate_stage
    from aiayn.stages import tokenize as tokenize_stage
    from aiayn.stages import train as train_stage

    monkeypatch.setenv("AIAYN_TRACKING", "0")
    raw = yaml.safe_load((REPO / "configs" / "wmt14_base.yaml").read_text())
    raw["data"]["corpus"] = {**raw["data"]["corpus"], "name": None, "config": None, "path": str(hf_local)}
    raw["data"]["corpus"].pop("name"), raw["data"]["corpus"].pop("config"), raw["data"]["corpus"].pop("revision")
    raw["tokenize"] |= {"vocab_size": 80, "input_sentence_size": 120}
    raw["model"] |= {"d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1}
    raw["train"] |= {"max_steps": 3, "max_tokens": 256, "warmup_steps": 2, "checkpoint_every": 3,
                     "validate_every": 3, "keep_checkpoints": 1, "average_last": 1, "num_threads": 1}
    raw["evaluate"] |= {"beam_size": 2, "max_len_b": 5, "device": "cpu"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert check_params_file(tmp_path / "params.yaml", tmp_path) == []
    params = params_from_dict(raw)
    assert params.data.test_splits == ("newstest2014",) and params.quantize.gate_split == "newstest2014"
    layout = Layout(tmp_path)
    corpus_stage.run(params, layout)
    prepare_stage.run(params, layout)
    assert _prepared(tmp_path, "newstest2013") == VAL and _prepared(tmp_path, "newstest2014") == TEST
    tokenize_stage.run(params, layout)
    train_stage.run(params, layout)
    metrics = evaluate_stage.run(params, layout)
    assert set(metrics) == {"newstest2014"} and 0 <= metrics["newstest2014"]["bleu"] <= 100
    scores = json.loads((layout.eval / "scores.json").read_text())
    assert scores["newstest2014"]["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert (layout.eval / "newstest2014.hyp.de").is_file()
