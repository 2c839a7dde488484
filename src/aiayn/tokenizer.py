"""Joint sentencepiece subword model and compact encoded-split storage.

One sentencepiece model (Kudo & Richardson 2018) is trained over both sides of
the training text, so source and target share one vocabulary — the shared
embedding matrix of paper Section 3.4 needs that. Special ids are fixed for
every model: ``PAD_ID=0, UNK_ID=1, BOS_ID=2, EOS_ID=3`` (``aiayn.config.schema``).

Training is deterministic: all sentences are used in file order (no sampling,
no shuffling; or, with ``input_sentence_size``, a seeded sample), a fixed thread
count, and the model is trained in memory so no input path or output prefix is
recorded in it; the same corpus and ``TokenizerConfig`` give a byte-identical
``.model``. Text is streamed from the files, and ``encode_files`` writes encoded
splits chunk by chunk, so neither step holds a WMT-sized corpus in Python lists. Text normalisation is
sentencepiece's default ``nmt_nfkc`` (NFKC plus whitespace clean-up, e.g. tab
and no-break space become a space), so ``decode(encode(x))`` returns ``x`` in
that normal form.

Encoded splits are stored as four ``.npy`` files per split (flat token ids plus
offsets, CSR-style): no pickle, no zip timestamps, deterministic bytes.

Errors: ``TokenizerError`` (a ``ValueError``) naming the file or bad value.
"""

from __future__ import annotations

import io
import itertools
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID, TokenizerConfig
from aiayn.data.readers import iter_line_chunks
from aiayn.io import atomic_path, atomic_write_bytes, atomic_write_text

__all__ = [
    "TokenizerError",
    "train_tokenizer",
    "Tokenizer",
    "EncodedSplit",
    "save_encoded",
    "load_encoded",
    "encoded_files",
    "encode_files",
]

#: Trainer threads. Fixed, because sentencepiece records it in the model proto
#: (a different value changes the ``.model`` bytes).
_NUM_THREADS = 1
#: Seed of sentencepiece's sentence sampler (``input_sentence_size`` > 0 only).
SAMPLE_SEED = 1
#: Sentences per ``encode`` call when encoding a file (``encode_files``).
ENCODE_CHUNK = 20_000


class TokenizerError(ValueError):
    """Tokenizer training/loading failed or an encoded split is missing or corrupt."""


# --------------------------------------------------------------------------- training


def train_tokenizer(text_files: list[Path], model_prefix: Path, cfg: TokenizerConfig) -> Path:
    """Train a joint sentencepiece model on the lines of ``text_files``.

    ``text_files`` are streamed with ``aiayn.data.readers.iter_line_chunks`` (UTF-8 or gzip, validated, NFC) and
    concatenated in the order given; with ``cfg.input_sentence_size`` N > 0, sentencepiece trains on N
    of them drawn by its reservoir sampler, seeded (``SAMPLE_SEED``) so the same text gives the same
    model; 0 trains on every line (no sampling, no shuffling). Writes ``{model_prefix}.model``
    (serialized ``ModelProto``) and ``{model_prefix}.vocab`` (``piece<TAB>score`` per id,
    sentencepiece's format) atomically, and returns the ``.model`` path.

    Settings: ``cfg.model_type``, ``cfg.vocab_size`` (pieces, specials
    included), ``cfg.character_coverage``; ids pad=0 ``<pad>``, unk=1 ``<unk>``,
    bos=2 ``<s>``, eos=3 ``</s>``.

    Raises ``TokenizerError`` when there is no text or sentencepiece refuses the
    settings (e.g. ``vocab_size`` larger than the corpus supports).
    """
    stream = (line for path in text_files for chunk in iter_line_chunks(Path(path)) for line in chunk)
    first = next(stream, None)
    if first is None:
        raise TokenizerError(f"no training text in {[str(p) for p in text_files]}")
    sampling = cfg.input_sentence_size > 0
    if sampling:
        spm.set_random_generator_seed(SAMPLE_SEED)
    proto = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain([first], stream),
            model_writer=proto,
            model_type=cfg.model_type,
            vocab_size=cfg.vocab_size,
            character_coverage=cfg.character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece="<pad>",
            input_sentence_size=cfg.input_sentence_size,  # 0 = use every sentence
            shuffle_input_sentence=sampling,
            num_threads=_NUM_THREADS,
            minloglevel=2,  # warnings and errors only
        )
    except RuntimeError as e:
        raise TokenizerError(
            f"sentencepiece training failed ({cfg.model_type}, vocab_size={cfg.vocab_size}, "
            f"input_sentence_size={cfg.input_sentence_size}, text {[str(p) for p in text_files]}): {e}"
        ) from e

    model_bytes = proto.getvalue()
    model_prefix = Path(model_prefix)
    model_path = model_prefix.with_name(model_prefix.name + ".model")
    vocab_path = model_prefix.with_name(model_prefix.name + ".vocab")
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))
    atomic_write_bytes(model_path, model_bytes)
    atomic_write_text(vocab_path, vocab)
    return model_path


# --------------------------------------------------------------------------- encode / decode


class Tokenizer:
    """A loaded sentencepiece model with this project's special ids.

    ``encode`` adds no BOS/EOS; the model code adds them where it needs them.
    """

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, processor: spm.SentencePieceProcessor, *, source: str = "<memory>") -> None:
        got = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        want = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
        if got != want:
            raise TokenizerError(f"{source}: special ids (pad, unk, bos, eos) are {got}, expected {want}")
        self._sp = processor
        self.source = source

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Load a ``.model`` file. Raises ``TokenizerError`` if missing or unreadable."""
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"tokenizer model not found: {path} (run `aiayn tokenize`)")
        return cls.from_bytes(path.read_bytes(), source=str(path))

    @classmethod
    def from_bytes(cls, model_proto: bytes, *, source: str = "<memory>") -> "Tokenizer":
        """Load a serialized ``ModelProto``. Raises ``TokenizerError`` if it does not parse."""
        try:
            sp = spm.SentencePieceProcessor(model_proto=model_proto)
        except (RuntimeError, OSError) as e:
            raise TokenizerError(f"{source}: not a sentencepiece model: {e}") from e
        return cls(sp, source=source)

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special ids included."""
        return self._sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Texts -> id lists (no BOS/EOS). Unknown characters map to ``UNK_ID``."""
        if isinstance(texts, str):
            raise TypeError("encode() takes a list of strings, got a single str")
        return self._sp.encode(list(texts), out_type=int)

    def encode_known(self, text: str) -> tuple[list[int], list[str]]:
        """``text`` -> ``(ids, unknown)``: the ids of ``text`` with every character the model does not
        know left out (no ``UNK_ID``; whitespace around a removed run collapses to one space), and
        the removed runs of unknown characters, in order (``[]`` when there were none)."""
        proto = self._sp.encode(text, out_type="proto")
        unknown = [p.surface for p in proto.pieces if p.id == UNK_ID]
        if not unknown:
            return [p.id for p in proto.pieces], []
        kept = " ".join("".join(p.surface if p.id != UNK_ID else " " for p in proto.pieces).split())
        return [i for i in self._sp.encode(kept, out_type=int) if i != UNK_ID], unknown

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Id sequences -> texts.

        Each sequence is cut at its first ``EOS_ID`` (the EOS and everything
        after are dropped); ``PAD_ID`` and ``BOS_ID`` are dropped. Accepts lists
        or 1-D integer arrays. Raises ``TokenizerError`` for an id outside
        ``[0, vocab_size)``.
        """
        cleaned: list[list[int]] = []
        for row, seq in enumerate(ids):
            seq = [int(t) for t in seq]
            if EOS_ID in seq:
                seq = seq[: seq.index(EOS_ID)]
            bad = [t for t in seq if not 0 <= t < self.vocab_size]
            if bad:
                raise TokenizerError(f"sequence {row}: id {bad[0]} outside [0, {self.vocab_size})")
            cleaned.append([t for t in seq if t not in (PAD_ID, BOS_ID)])
        return self._sp.decode(cleaned) if cleaned else []

    def normalize(self, texts: list[str]) -> list[str]:
        """``texts`` as the model reads them: sentencepiece's own normalizer (the model's rule, here
        ``nmt_nfkc``: NFKC, so NFD and NFC input agree, plus whitespace clean-up), with its word-start
        marks turned back into single spaces (a literal U+2581 in the text becomes a space too)."""
        if isinstance(texts, str):
            raise TypeError("normalize() takes a list of strings, got a single str")
        return [" ".join(t.replace("\u2581", " ").split()) for t in self._sp.normalize(list(texts))]

    def pieces(self, text: str) -> list[str]:
        """Subword pieces of ``text`` (``'▁'`` U+2581 marks a word start)."""
        return self._sp.encode(text, out_type=str)

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(i)


# --------------------------------------------------------------------------- encoded splits


@dataclass(frozen=True, eq=False)
class EncodedSplit:
    """A tokenized parallel split in flat (CSR) form; sentence ``i`` of each side is
    ``ids[offsets[i]:offsets[i + 1]]``. No BOS/EOS are stored.

    ``src_ids``      ``(N_src_tokens,)`` int32
    ``src_offsets``  ``(n + 1,)`` int64, ``src_offsets[0] == 0``, non-decreasing,
                     ``src_offsets[-1] == N_src_tokens``
    ``tgt_ids``, ``tgt_offsets``: the same for the target side.

    Raises ``TokenizerError`` at construction when these invariants fail.
    """

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray

    def __post_init__(self) -> None:
        _check_split(self.src_ids, self.src_offsets, self.tgt_ids, self.tgt_offsets, "EncodedSplit")

    @classmethod
    def from_lists(cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> "EncodedSplit":
        """Build from per-sentence id lists (as ``Tokenizer.encode`` returns)."""
        if len(src) != len(tgt):
            raise TokenizerError(f"source has {len(src)} sentences but target has {len(tgt)}")
        src_ids, src_offsets = _flatten(src)
        tgt_ids, tgt_offsets = _flatten(tgt)
        return cls(src_ids, src_offsets, tgt_ids, tgt_offsets)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def src(self, i: int) -> np.ndarray:
        """Source ids of sentence ``i``: ``(src_len,)`` int32."""
        return self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        """Target ids of sentence ``i``: ``(tgt_len,)`` int32."""
        return self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]

    @property
    def src_lengths(self) -> np.ndarray:
        """``(n,)`` int64: source lengths in tokens (no BOS/EOS)."""
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        """``(n,)`` int64: target lengths in tokens (no BOS/EOS)."""
        return np.diff(self.tgt_offsets)


_ARRAYS = (("src", "ids"), ("src", "offsets"), ("tgt", "ids"), ("tgt", "offsets"))
_DTYPES = {"ids": np.dtype("<i4"), "offsets": np.dtype("<i8")}


def encoded_files(directory: str | Path, split: str) -> list[Path]:
    """The four files of a split: ``{split}.{src,tgt}.{ids,offsets}.npy``."""
    return [Path(directory) / f"{split}.{side}.{kind}.npy" for side, kind in _ARRAYS]


def save_encoded(directory: str | Path, split: str, enc: EncodedSplit) -> list[Path]:
    """Write ``enc`` as four ``.npy`` files (little-endian, C order), each atomically.

    Returns the written paths (``encoded_files`` order).
    """
    paths = encoded_files(directory, split)
    for path, (side, kind) in zip(paths, _ARRAYS):
        arr = np.ascontiguousarray(getattr(enc, f"{side}_{kind}"), dtype=_DTYPES[kind])
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, arr, allow_pickle=False)
    return paths


def encode_files(tok: "Tokenizer", src_path: Path, tgt_path: Path, directory: str | Path, split: str,
                 *, chunk: int = ENCODE_CHUNK) -> "EncodedSplit":
    """Encode two aligned text files into the four ``.npy`` files of ``split`` in ``directory``, streaming.

    Lines are read ``chunk`` at a time (``aiayn.data.readers.iter_line_chunks``, one chunk ahead on a helper
    thread), encoded by sentencepiece's own
    batched, multi-threaded ``encode`` and appended to the id file, so memory holds one chunk and the
    ``(n + 1,)`` offsets, never the corpus. The files are byte for byte what
    ``save_encoded(EncodedSplit.from_lists(tok.encode(src), tok.encode(tgt)))`` writes. Returns the split,
    memory-mapped (``load_encoded``).

    Raises ``TokenizerError`` when the files hold different numbers of lines; ``CorpusError`` for
    malformed text.
    """
    directory = Path(directory)
    counts = []
    for side, path in (("src", src_path), ("tgt", tgt_path)):
        ids_path, offsets_path = (directory / f"{split}.{side}.{kind}.npy" for kind in ("ids", "offsets"))
        lengths: list[np.ndarray] = []
        with atomic_path(ids_path) as tmp:
            raw = tmp.with_name(tmp.name + ".raw")
            try:
                with open(raw, "wb") as out:
                    for batch in _prefetched(iter_line_chunks(Path(path), chunk)):
                        ids = tok.encode(batch)
                        n = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
                        out.write(np.fromiter(itertools.chain.from_iterable(ids), dtype=_DTYPES["ids"],
                                              count=int(n.sum())).tobytes())
                        lengths.append(n)
                offsets = np.zeros(sum(map(len, lengths)) + 1, dtype=_DTYPES["offsets"])
                if lengths:
                    np.cumsum(np.concatenate(lengths), out=offsets[1:])
                with open(tmp, "wb") as f, open(raw, "rb") as data:
                    np.lib.format.write_array_header_1_0(
                        f, {"descr": _DTYPES["ids"].str, "fortran_order": False, "shape": (int(offsets[-1]),)})
                    shutil.copyfileobj(data, f, 1 << 24)
            finally:
                raw.unlink(missing_ok=True)
        with atomic_path(offsets_path) as tmp, open(tmp, "wb") as f:
            np.save(f, offsets, allow_pickle=False)
        counts.append((str(path), len(offsets) - 1))
    if counts[0][1] != counts[1][1]:
        raise TokenizerError(f"{counts[0][0]} has {counts[0][1]} lines but {counts[1][0]} has {counts[1][1]}")
    return load_encoded(directory, split)


def _prefetched(chunks: Iterator[list[str]]) -> Iterator[list[str]]:
    """``chunks``, the next one read (and validated) by a helper thread while the caller encodes the current
    one: sentencepiece's ``encode`` releases the GIL, so reading overlaps encoding."""
    with ThreadPoolExecutor(1, thread_name_prefix="aiayn-read") as pool:
        pending = pool.submit(next, chunks, None)
        while (batch := pending.result()) is not None:
            pending = pool.submit(next, chunks, None)
            yield batch


def load_encoded(
    directory: str | Path, split: str, *, mmap: bool = True, vocab_size: int | None = None
) -> EncodedSplit:
    """Read a split written by ``save_encoded`` (memory-mapped read-only if ``mmap``).

    With ``vocab_size``, every id is also checked to lie in ``[0, vocab_size)``.
    Raises ``TokenizerError`` naming the file: missing, unreadable or not
    ``.npy``, wrong dtype or rank, offsets not starting at 0 / decreasing / not
    ending at the id count, source and target sentence counts differing, or an
    id out of range.
    """
    arrays: dict[str, np.ndarray] = {}
    for path, (side, kind) in zip(encoded_files(directory, split), _ARRAYS):
        if not path.is_file():
            raise TokenizerError(f"encoded split file missing: {path} (run `aiayn tokenize`)")
        try:
            arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise TokenizerError(f"{path}: corrupt or not a .npy file: {e}") from e
        if arr.ndim != 1 or arr.dtype != _DTYPES[kind]:
            raise TokenizerError(f"{path}: expected 1-D {_DTYPES[kind]}, got {arr.ndim}-D {arr.dtype}")
        arrays[f"{side}_{kind}"] = arr
    _check_split(**arrays, where=f"{Path(directory) / split}.*.npy")
    enc = EncodedSplit(**arrays)
    if vocab_size is not None:
        for side in ("src", "tgt"):
            ids = arrays[f"{side}_ids"]
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                raise TokenizerError(
                    f"{Path(directory) / f'{split}.{side}.ids.npy'}: ids span [{int(ids.min())}, {int(ids.max())}], "
                    f"outside [0, {vocab_size})"
                )
    return enc


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = [t for s in seqs for t in s]
    ids = np.asarray(flat, dtype=np.int32) if flat else np.zeros(0, dtype=np.int32)
    return ids, offsets


def _check_split(
    src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray, tgt_offsets: np.ndarray, where: str
) -> None:
    sides = {"src": (src_ids, src_offsets), "tgt": (tgt_ids, tgt_offsets)}
    for side, (ids, offsets) in sides.items():
        ids, offsets = np.asarray(ids), np.asarray(offsets)
        if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1:
            raise TokenizerError(f"{where}: {side} ids/offsets must be 1-D with at least one offset")
        if not np.issubdtype(ids.dtype, np.integer) or not np.issubdtype(offsets.dtype, np.integer):
            raise TokenizerError(f"{where}: {side} ids/offsets must be integer, got {ids.dtype}/{offsets.dtype}")
        if offsets[0] != 0:
            raise TokenizerError(f"{where}: {side}_offsets[0] is {int(offsets[0])}, expected 0")
        steps = np.diff(offsets)
        if steps.size and steps.min() < 0:
            i = int(np.argmax(steps < 0))
            raise TokenizerError(
                f"{where}: {side}_offsets decrease at sentence {i} ({int(offsets[i])} -> {int(offsets[i + 1])})"
            )
        if offsets[-1] != len(ids):
            raise TokenizerError(
                f"{where}: {side}_offsets end at {int(offsets[-1])} but there are {len(ids)} {side} ids"
            )
    if len(src_offsets) != len(tgt_offsets):
        raise TokenizerError(
            f"{where}: {len(src_offsets) - 1} source sentences but {len(tgt_offsets) - 1} target sentences"
        )
