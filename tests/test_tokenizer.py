"""Sentencepiece training determinism, encode/decode, encoded-split storage, tokenize stage."""

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID, DataConfig, Params, TokenizerConfig
from aiayn.data.readers import CorpusError, read_lines
from aiayn.data.multi30k import fetch_corpus
from aiayn.stages import Layout
from aiayn.stages import prepare as prepare_stage
from aiayn.stages import tokenize as tokenize_stage
from aiayn.tokenizer import (
    EncodedSplit,
    Tokenizer,
    TokenizerError,
    encoded_files,
    load_encoded,
    save_encoded,
    train_tokenizer,
)

CFG = TokenizerConfig(model_type="bpe", vocab_size=1000, character_coverage=1.0)


def _normal_form(text: str) -> str:
    """What sentencepiece's nmt_nfkc rule should give for plain caption text."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


@pytest.fixture(scope="module")
def corpus_files(multi30k_mirror, tmp_path_factory) -> list[Path]:
    """3000 real training sentences: the first 1500 English and 1500 German."""
    out = tmp_path_factory.mktemp("text")
    files = []
    for lang in ("en", "de"):
        path = out / f"train.{lang}"
        path.write_text("\n".join(read_lines(multi30k_mirror / f"train.{lang}.gz")[:1500]) + "\n", encoding="utf-8")
        files.append(path)
    return files


@pytest.fixture(scope="module")
def model_path(corpus_files, tmp_path_factory) -> Path:
    return train_tokenizer(corpus_files, tmp_path_factory.mktemp("spm_a") / "spm", CFG)


@pytest.fixture(scope="module")
def tok(model_path) -> Tokenizer:
    return Tokenizer.load(model_path)


# --------------------------------------------------------------------------- training


def test_training_is_deterministic(corpus_files, model_path, tmp_path):
    again = train_tokenizer(corpus_files, tmp_path / "other" / "spm", CFG)
    assert again.name == "spm.model" and again != model_path
    assert again.read_bytes() == model_path.read_bytes()
    assert again.with_suffix(".vocab").read_bytes() == model_path.with_suffix(".vocab").read_bytes()


def test_training_unigram_is_deterministic(corpus_files, tmp_path):
    cfg = TokenizerConfig(model_type="unigram", vocab_size=1000)
    a = train_tokenizer(corpus_files, tmp_path / "a" / "spm", cfg)
    b = train_tokenizer(corpus_files, tmp_path / "b" / "spm", cfg)
    assert a.read_bytes() == b.read_bytes()


def test_model_has_fixed_special_ids_and_vocab_file(tok, model_path):
    assert tok.vocab_size == CFG.vocab_size
    assert [tok.id_to_piece(i) for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)] == ["<pad>", "<unk>", "<s>", "</s>"]
    rows = model_path.with_suffix(".vocab").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(rows) == CFG.vocab_size
    assert [r.split("\t")[0] for r in rows] == [tok.id_to_piece(i) for i in range(CFG.vocab_size)]


def test_training_vocab_too_large_is_clear_error(corpus_files, tmp_path):
    with pytest.raises(TokenizerError, match="vocab_size=500000"):
        train_tokenizer(corpus_files, tmp_path / "spm", TokenizerConfig(vocab_size=500000))
    assert not (tmp_path / "spm.model").exists()


# --------------------------------------------------------------------------- encode / decode


def test_encode_decode_round_trip_real_sentences(tok, multi30k_mirror):
    texts = read_lines(multi30k_mirror / "val.en.gz")[:100] + read_lines(multi30k_mirror / "val.de.gz")[:100]
    ids = tok.encode(texts)
    assert len(ids) == len(texts)
    flat = [t for seq in ids for t in seq]
    assert all(0 <= t < tok.vocab_size for t in flat)
    assert not {PAD_ID, BOS_ID, EOS_ID} & set(flat)
    assert tok.decode(ids) == [_normal_form(t) for t in texts]
    # Subwords really are subwords: fewer tokens than characters, more than words.
    n_chars = sum(len(t) for t in texts)
    n_words = sum(len(t.split()) for t in texts)
    assert n_words < len(flat) < n_chars


def test_decode_drops_specials_and_stops_at_eos(tok):
    (ids,) = tok.encode(["Ein Hund läuft über die Wiese ."])
    text = tok.decode([ids])[0]
    other = tok.encode(["Zwei Katzen"])[0]
    assert tok.decode([[BOS_ID, *ids, EOS_ID, *other, PAD_ID], [BOS_ID, *ids, PAD_ID, PAD_ID]]) == [text, text]
    assert tok.decode([np.array([EOS_ID, *ids], dtype=np.int64)]) == [""]
    with pytest.raises(TokenizerError, match=f"id {tok.vocab_size}"):
        tok.decode([[5, tok.vocab_size]])


def test_pieces(tok):
    text = "Zwei Hunde spielen im Schnee ."
    pieces = tok.pieces(text)
    assert pieces[0].startswith("\u2581")
    assert "".join(pieces).replace("\u2581", " ").strip() == text
    assert [tok.id_to_piece(i) for i in tok.encode([text])[0]] == pieces


def test_load_errors(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.load(tmp_path / "missing.model")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match="bad.model"):
        Tokenizer.load(bad)


# --------------------------------------------------------------------------- encoded splits


def _random_lists(rng: np.random.Generator, n: int, vocab: int) -> list[list[int]]:
    return [rng.integers(0, vocab, size=int(rng.integers(0, 12))).tolist() for _ in range(n)]


def test_encoded_split_round_trip_and_deterministic_bytes(tmp_path):
    rng = np.random.default_rng(1234)
    src, tgt = _random_lists(rng, 37, 900), _random_lists(rng, 37, 900)
    enc = EncodedSplit.from_lists(src, tgt)
    assert len(enc) == 37
    assert enc.src_ids.dtype == np.int32 and enc.src_offsets.dtype == np.int64
    assert enc.src_lengths.tolist() == [len(s) for s in src]
    assert enc.tgt_lengths.tolist() == [len(t) for t in tgt]

    paths_a = save_encoded(tmp_path / "a", "val", enc)
    paths_b = save_encoded(tmp_path / "b", "val", enc)
    assert [p.name for p in paths_a] == [
        "val.src.ids.npy", "val.src.offsets.npy", "val.tgt.ids.npy", "val.tgt.offsets.npy"
    ]
    assert [p.read_bytes() for p in paths_a] == [p.read_bytes() for p in paths_b]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in paths_a)  # no temp files

    for mmap in (True, False):
        back = load_encoded(tmp_path / "a", "val", mmap=mmap, vocab_size=900)
        assert len(back) == 37
        assert [back.src(i).tolist() for i in range(37)] == src
        assert [back.tgt(i).tolist() for i in range(37)] == tgt


def test_encoded_split_validation():
    ids = np.arange(5, dtype=np.int32)
    good = np.array([0, 2, 5], dtype=np.int64)
    with pytest.raises(TokenizerError, match=r"decrease at sentence 1 \(3 -> 2\)"):
        EncodedSplit(ids, np.array([0, 3, 2, 5]), ids[:0], np.zeros(4, np.int64))
    with pytest.raises(TokenizerError, match="end at 4 but there are 5"):
        EncodedSplit(ids, np.array([0, 2, 4]), ids, good)
    with pytest.raises(TokenizerError, match=r"src_offsets\[0\] is 1"):
        EncodedSplit(ids, np.array([1, 2, 5]), ids, good)
    with pytest.raises(TokenizerError, match="2 source sentences but 1 target"):
        EncodedSplit(ids, good, ids, np.array([0, 5]))
    with pytest.raises(TokenizerError, match="3 sentences but target has 2"):
        EncodedSplit.from_lists([[1], [2], [3]], [[1], [2]])


def test_load_encoded_corrupt_files(tmp_path):
    rng = np.random.default_rng(7)
    enc = EncodedSplit.from_lists(_random_lists(rng, 20, 50), _random_lists(rng, 20, 50))
    src_ids, src_offsets, tgt_ids, tgt_offsets = encoded_files(tmp_path, "train")

    save_encoded(tmp_path, "train", enc)
    data = src_ids.read_bytes()
    src_ids.write_bytes(data[: len(data) - 7])  # truncated
    with pytest.raises(TokenizerError, match="train.src.ids.npy"):
        load_encoded(tmp_path, "train")

    save_encoded(tmp_path, "train", enc)
    bad = np.asarray(enc.tgt_offsets).copy()
    bad[5], bad[6] = bad[6] + 1, bad[5]
    np.save(tgt_offsets, bad)
    with pytest.raises(TokenizerError, match="tgt_offsets decrease"):
        load_encoded(tmp_path, "train")

    save_encoded(tmp_path, "train", enc)
    np.save(src_ids, np.asarray(enc.src_ids, dtype=np.float32))
    with pytest.raises(TokenizerError, match="expected 1-D int32"):
        load_encoded(tmp_path, "train")

    save_encoded(tmp_path, "train", enc)
    with pytest.raises(TokenizerError, match=r"outside \[0, 10\)"):
        load_encoded(tmp_path, "train", vocab_size=10)

    tgt_ids.unlink()
    with pytest.raises(TokenizerError, match="missing.*aiayn tokenize"):
        load_encoded(tmp_path, "train")


# --------------------------------------------------------------------------- tokenize stage


def test_tokenize_stage_real_data(multi30k_mirror, tmp_path):
    layout = Layout(tmp_path)
    fetch_corpus(layout.raw, mirror=multi30k_mirror,
                 files=[f"{s}.{lang}.gz" for s in ("train", "val", "test_2016_flickr", "test_2017_flickr",
                                                    "test_2017_mscoco") for lang in ("en", "de")])
    params = Params(data=DataConfig(max_train_pairs=1500, max_eval_pairs=40), tokenize=CFG)
    prepare_stage.run(params, layout)
    meta = tokenize_stage.run(params, layout)

    assert json.loads((layout.tokenized / "meta.json").read_text()) == meta
    assert meta["vocab_size"] == CFG.vocab_size
    tok = Tokenizer.load(layout.tokenized / "spm.model")
    assert (layout.tokenized / "spm.vocab").is_file()
    for split in ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"):
        en = (layout.prepared / f"{split}.en").read_text(encoding="utf-8").splitlines()
        de = (layout.prepared / f"{split}.de").read_text(encoding="utf-8").splitlines()
        enc = load_encoded(layout.tokenized, split, vocab_size=tok.vocab_size)
        stats = meta["splits"][split]
        assert stats["n"] == len(enc) == len(en) == len(de)
        src_lens = [len(x) for x in tok.encode(en)]
        tgt_lens = [len(x) for x in tok.encode(de)]
        assert stats["src_tokens"] == sum(src_lens) and stats["tgt_tokens"] == sum(tgt_lens)
        assert stats["mean_src_len"] == pytest.approx(np.mean(src_lens), abs=1e-4)
        assert stats["mean_tgt_len"] == pytest.approx(np.mean(tgt_lens), abs=1e-4)
        assert tok.decode([enc.tgt(i) for i in range(3)]) == [_normal_form(t) for t in de[:3]]
    # The stage's model is the same model train_tokenizer gives on the same text.
    direct = train_tokenizer([layout.prepared / "train.en", layout.prepared / "train.de"], tmp_path / "d" / "spm", CFG)
    assert direct.read_bytes() == (layout.tokenized / "spm.model").read_bytes()


def test_tokenize_stage_requires_prepare(tmp_path):
    with pytest.raises(TokenizerError, match="aiayn prepare"):
        tokenize_stage.run(Params(), Layout(tmp_path))


# --------------------------------------------------------------------------- streaming


def test_encode_files_writes_what_save_encoded_writes(tmp_path):
    """The streamed, chunked encoder gives the .npy bytes of the in-memory path (the main job unchanged)."""
    from support import tiny

    from aiayn.tokenizer import encode_files

    tok = tiny.tokenizer(tmp_path)
    en, de = tiny.corpus(257, 3)
    (tmp_path / "s.en").write_text("".join(x + "\n" for x in en))
    (tmp_path / "s.de").write_text("".join(x + "\n" for x in de))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    save_encoded(tmp_path / "a", "s", EncodedSplit.from_lists(tok.encode(en), tok.encode(de)))
    enc = encode_files(tok, tmp_path / "s.en", tmp_path / "s.de", tmp_path / "b", "s", chunk=10)
    for a, b in zip(encoded_files(tmp_path / "a", "s"), encoded_files(tmp_path / "b", "s")):
        assert a.read_bytes() == b.read_bytes(), b.name
    assert len(enc) == 257 and list(enc.tgt(5)) == tok.encode([de[5]])[0]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(p.name for p in encoded_files(tmp_path / "b", "s"))
    (tmp_path / "s.de").write_text("".join(x + "\n" for x in de[:-1]))
    with pytest.raises(TokenizerError, match="has 257 lines but .* has 256"):
        encode_files(tok, tmp_path / "s.en", tmp_path / "s.de", tmp_path / "b", "s")


def test_sampled_tokenizer_training_is_seeded(tmp_path):
    """``input_sentence_size``: sentencepiece trains on a seeded sample, so the same text gives the same model."""
    from support import tiny

    en, de = tiny.corpus(600, 4)
    (tmp_path / "t.txt").write_text("\n".join(en + de) + "\n")
    cfg = TokenizerConfig(vocab_size=120, input_sentence_size=300)
    a = train_tokenizer([tmp_path / "t.txt"], tmp_path / "a", cfg).read_bytes()
    b = train_tokenizer([tmp_path / "t.txt"], tmp_path / "b", cfg).read_bytes()
    full = train_tokenizer([tmp_path / "t.txt"], tmp_path / "c", TokenizerConfig(vocab_size=120)).read_bytes()
    assert a == b and a != full
    with pytest.raises(ValueError, match="input_sentence_size must be 0"):
        TokenizerConfig(input_sentence_size=50)


def test_iter_line_chunks_is_read_lines_streamed(multi30k_mirror, tmp_path):
    from aiayn.data.readers import iter_line_chunks

    def iter_lines(path):  # chunks of 2 lines: a problem in the second chunk is named at its own line
        return (line for chunk in iter_line_chunks(path, 2) for line in chunk)

    assert list(iter_lines(multi30k_mirror / "val.de.gz")) == read_lines(multi30k_mirror / "val.de.gz")
    (tmp_path / "x").write_bytes(b"\xef\xbb\xbfone\ntwo\n\nfour\n")
    with pytest.raises(CorpusError, match=r"x:3: empty line"):
        list(iter_lines(tmp_path / "x"))
    (tmp_path / "y").write_bytes(b"\xef\xbb\xbfone\r\nCafe\xcc\x81  \n")  # BOM, CRLF, decomposed e-acute
    assert list(iter_lines(tmp_path / "y")) == read_lines(tmp_path / "y") == ["one", "Caf\u00e9"]
    (tmp_path / "z").write_bytes(b"ok\nbell\x07\n")
    with pytest.raises(CorpusError, match=r"z:2: control character U\+0007"):
        list(iter_lines(tmp_path / "z"))
