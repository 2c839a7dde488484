"""Corpus fetch/verify, strict reading, filtering, and the fetch/prepare stages."""

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from aiayn.data import multi30k as corpus
from aiayn.config.schema import DataConfig, Params
from aiayn.data.hygiene import length_rule
from aiayn.data.readers import CorpusError, read_lines
from aiayn.data.multi30k import fetch_corpus
from aiayn.stages import Layout
from aiayn.stages import fetch as fetch_stage
from aiayn.stages import prepare as prepare_stage

EN_DE = [f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
         for lang in ("en", "de")]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _raw_lines(path: Path) -> list[str]:
    """Independent reader: gunzip, split on newline, NFC, strip trailing whitespace."""
    text = gzip.decompress(path.read_bytes()).decode("utf-8")
    return [unicodedata.normalize("NFC", x.rstrip()) for x in text.split("\n")[:-1]]


# --------------------------------------------------------------------------- fetch


def test_embedded_checksums_match_mirror_sums(multi30k_mirror):
    listed = dict(reversed(line.split("  ")) for line in (multi30k_mirror / "SHA256SUMS").read_text().splitlines())
    assert corpus.MULTI30K_SHA256 == listed


def test_fetch_from_mirror_verifies_and_writes_sums(multi30k_mirror, tmp_path):
    out = tmp_path / "raw"
    paths = fetch_corpus(out, mirror=multi30k_mirror, files=["val.en.gz", "val.de.gz"])
    assert [p.name for p in paths] == ["val.en.gz", "val.de.gz"]
    for p in paths:
        assert _sha(p) == _sha(multi30k_mirror / p.name)
    sums = (out / "SHA256SUMS").read_text()
    assert sums == "".join(f"{_sha(multi30k_mirror / n)}  {n}\n" for n in ["val.de.gz", "val.en.gz"])
    assert sorted(os.listdir(out)) == ["SHA256SUMS", "val.de.gz", "val.en.gz"]
    # Present and verified -> skipped: a mirror that does not exist is never touched.
    fetch_corpus(out, mirror=tmp_path / "nowhere", files=["val.en.gz"])
    # Present but corrupt -> fetched again.
    (out / "val.en.gz").write_bytes(b"garbage")
    fetch_corpus(out, mirror=multi30k_mirror, files=["val.en.gz"])
    assert _sha(out / "val.en.gz") == _sha(multi30k_mirror / "val.en.gz")


def test_fetch_stage_all_files_from_env_mirror(multi30k_mirror, tmp_path, monkeypatch):
    monkeypatch.setenv(corpus.MIRROR_ENV, str(multi30k_mirror))
    summary = fetch_stage.run(Layout(tmp_path))
    raw = Layout(tmp_path).raw
    assert summary["n_files"] == 18
    # Same file as the mirror's SHA256SUMS, byte for byte.
    assert (raw / "SHA256SUMS").read_bytes() == (multi30k_mirror / "SHA256SUMS").read_bytes()


def test_fetch_refuses_tampered_file_and_leaves_nothing(multi30k_mirror, tmp_path):
    bad_mirror = tmp_path / "mirror"
    bad_mirror.mkdir()
    for name in ("val.en.gz", "val.de.gz"):
        shutil.copyfile(multi30k_mirror / name, bad_mirror / name)
    with open(bad_mirror / "val.de.gz", "ab") as f:
        f.write(b"\x00")
    actual = _sha(bad_mirror / "val.de.gz")
    out = tmp_path / "raw"
    with pytest.raises(CorpusError) as err:
        fetch_corpus(out, mirror=bad_mirror, files=["val.en.gz", "val.de.gz"])
    msg = str(err.value)
    assert "val.de.gz" in msg and corpus.MULTI30K_SHA256["val.de.gz"] in msg and actual in msg
    assert os.listdir(out) == []


def test_fetch_download_path_with_file_url(multi30k_mirror, tmp_path, monkeypatch):
    monkeypatch.delenv(corpus.MIRROR_ENV, raising=False)
    monkeypatch.setattr(corpus, "MULTI30K_UPSTREAM", multi30k_mirror.resolve().as_uri())
    (path,) = fetch_corpus(tmp_path, files=["test_2017_mscoco.en.gz"])
    assert _sha(path) == _sha(multi30k_mirror / "test_2017_mscoco.en.gz")


def test_fetch_errors(multi30k_mirror, tmp_path):
    with pytest.raises(CorpusError, match="unknown Multi30k file"):
        fetch_corpus(tmp_path, mirror=multi30k_mirror, files=["train.xx.gz"])
    empty_mirror = tmp_path / "empty"
    empty_mirror.mkdir()
    with pytest.raises(CorpusError, match="val.en.gz is not in the mirror"):
        fetch_corpus(tmp_path / "out", mirror=empty_mirror, files=["val.en.gz"])


# --------------------------------------------------------------------------- read


def _write(path: Path, data: bytes, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_read_nfc_normalises_decomposed_text(tmp_path):
    decomposed = "Cafe\u0301 mit Gru\u0308n"  # e + COMBINING ACUTE, u + COMBINING DIAERESIS
    path = _write(tmp_path / "x.de", (decomposed + "\n").encode("utf-8"))
    assert read_lines(path) == ["Caf\u00e9 mit Gr\u00fcn"]


@pytest.mark.parametrize("gz", [False, True])
def test_read_rejects_invalid_utf8_with_file_and_line(tmp_path, gz):
    path = _write(tmp_path / "bad.de", b"gut\nschl\xffecht\n", gz)
    with pytest.raises(CorpusError, match=re.escape(f"{path}:2:") + ".*invalid UTF-8"):
        read_lines(path)


def test_read_rejects_empty_file(tmp_path):
    path = _write(tmp_path / "empty.en", b"")
    with pytest.raises(CorpusError, match=re.escape(str(path)) + ".*empty"):
        read_lines(path)


@pytest.mark.parametrize("blank", [b"", b"   ", b"\t"])
def test_read_rejects_empty_line(tmp_path, blank):
    path = _write(tmp_path / "e.en", b"one\ntwo\n" + blank + b"\nfour\n")
    with pytest.raises(CorpusError, match=re.escape(f"{path}:3: empty line")):
        read_lines(path)


@pytest.mark.parametrize("char, code", [("\x07", "U+0007"), ("\x1b", "U+001B"), ("\x85", "U+0085"),
                                        ("\u2028", "U+2028")])
def test_read_rejects_control_character(tmp_path, char, code):
    path = _write(tmp_path / "c.en", f"fine\tline\nbell{char}here\n".encode("utf-8"))
    with pytest.raises(CorpusError, match=re.escape(f"{path}:2: control character {code}") + ".*column 5"):
        read_lines(path)


# --------------------------------------------------------------------------- filter


@pytest.mark.parametrize("gz", [False, True])
def test_read_lines_plain_and_gzip(tmp_path, gz):
    path = _write(tmp_path / "a.en", b"\xef\xbb\xbfA dog runs .  \nTwo\tcats\r\nEnd", gz)  # BOM, CRLF, no final newline
    assert read_lines(path) == ["A dog runs .", "Two\tcats", "End"]


def test_read_lines_real_val(multi30k_mirror):
    assert read_lines(multi30k_mirror / "val.en.gz") == _raw_lines(multi30k_mirror / "val.en.gz")


def test_length_rule_names_the_first_rule_hit():
    cfg = DataConfig(min_words=2, max_words=5, max_ratio=2.0)
    pairs = [
        ("a", "b c"),  # too_short (src 1 word)
        ("a b c d e f", "u v w x y z"),  # too_long (6 > 5)
        ("a b", "v w x y z"),  # ratio 5/2 = 2.5 > 2
        ("a", "t u v w x y z"),  # too_short wins over too_long and ratio
        ("a b c", "x y z"),  # kept
        ("a b", "w x y z"),  # ratio exactly 2.0: kept
    ]
    assert [length_rule(src, tgt, cfg) for src, tgt in pairs] == [
        "too_short", "too_long", "ratio", "too_short", None, None]


# --------------------------------------------------------------------------- prepare stage


@pytest.fixture(scope="module")
def raw_layout(multi30k_mirror, tmp_path_factory) -> Layout:
    layout = Layout(tmp_path_factory.mktemp("proj"))
    fetch_corpus(layout.raw, mirror=multi30k_mirror, files=EN_DE)
    return layout


def test_prepare_real_data(raw_layout):
    layout = raw_layout
    layout.prepared.mkdir(parents=True, exist_ok=True)
    (layout.prepared / "stale.txt").write_text("old")
    data = DataConfig(max_train_pairs=2000)
    report = prepare_stage.run(Params(data=data), layout)

    assert json.loads((layout.prepared / "report.json").read_text()) == report
    assert not (layout.prepared / "stale.txt").exists()  # whole directory swapped
    for split, rep in report.items():
        assert rep["read"] == rep["kept"] + sum(rep["dropped"].values())
        assert rep["read"] == len(_raw_lines(layout.raw / f"{split}.en.gz"))
        for lang in ("en", "de"):
            lines = (layout.prepared / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")
            assert lines[-1] == "" and len(lines) - 1 == rep["kept"]

    train = report["train"]
    assert train["read"] == 29000 and train["kept"] == 2000
    # Kept train pairs obey the filter and are the first 2000 survivors, in order.
    en = (layout.prepared / "train.en").read_text(encoding="utf-8").splitlines()
    de = (layout.prepared / "train.de").read_text(encoding="utf-8").splitlines()
    raw_pairs = list(zip(_raw_lines(layout.raw / "train.en.gz"), _raw_lines(layout.raw / "train.de.gz")))
    survivors = [
        (s, t) for s, t in raw_pairs
        if 1 <= min(len(s.split()), len(t.split())) and max(len(s.split()), len(t.split())) <= 80
        and max(len(s.split()), len(t.split())) <= 3.0 * min(len(s.split()), len(t.split()))
    ]
    assert list(zip(en, de)) == survivors[:2000]
    assert train["dropped"]["max_pairs"] == len(survivors) - 2000

    # Validation and test splits are not filtered: every line, NFC, in order.
    for split in ("val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"):
        assert report[split]["kept"] == report[split]["read"]
        assert set(report[split]["dropped"].values()) == {0}
        for lang in ("en", "de"):
            got = (layout.prepared / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")[:-1]
            assert got == _raw_lines(layout.raw / f"{split}.{lang}.gz")


def test_prepare_max_eval_pairs(raw_layout, tmp_path):
    layout = Layout(tmp_path)
    shutil.copytree(raw_layout.raw, layout.raw)
    report = prepare_stage.run(Params(data=DataConfig(max_train_pairs=50, max_eval_pairs=7)), layout)
    assert report["val"] == {"read": 1014, "kept": 7, "dropped": {"max_pairs": 1007}}
    assert (layout.prepared / "val.de").read_text(encoding="utf-8").split("\n")[:-1] == \
        _raw_lines(layout.raw / "val.de.gz")[:7]


def test_prepare_missing_raw_tells_user_to_fetch(tmp_path):
    with pytest.raises(CorpusError) as err:
        prepare_stage.run(Params(), Layout(tmp_path))
    msg = str(err.value)
    assert "aiayn fetch" in msg and "AIAYN_DATA_MIRROR" in msg and "train.en.gz" in msg
    assert not Layout(tmp_path).prepared.exists()


# --------------------------------------------------------------------------- import hygiene


def test_core_modules_import_no_orchestration():
    code = (
        "import sys, aiayn.data.multi30k, aiayn.data.readers, aiayn.tokenizer, aiayn.evaluation.scoring, "
        "aiayn.stages.fetch, aiayn.stages.prepare, aiayn.stages.tokenize\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'prefect', 'dvc', 'mlflow'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
