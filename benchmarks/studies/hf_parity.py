"""Parity of the Hugging Face Marian export (``aiayn export-hf``) with aiayn, and of CTranslate2's stock
Transformers converter with ours.

Usage::

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/studies/hf_parity.py --model-dir artifacts/model \\
        [--mirror /work/shared/data/multi30k | --source X.en --reference X.de] [--split test_2016_flickr]
        [--lines N] [--beam-size 4] [--len-penalty 0.6] [--max-len-a 1.0] [--max-len-b 50] [--out FILE.md]

The split is read whole (``<split>.<src>.gz`` of the corpus mirror, or the prepared text), not the
smoke config's first 40 lines. Measured on the same sentences, aiayn eager (``aiayn.inference.translator``) as
the reference:

- tokens: ``MarianTokenizer(line).input_ids`` == our source ids (EOS included);
- teacher-forced log-probabilities of the references: max and mean |HF - aiayn| over every target
  position (EOS included) and every vocabulary entry;
- greedy: HF ``generate`` under our per-sentence length cap (``aiayn.export.hf_marian.marian_translate_ids``)
  token for token, and the text through HF's own tokenizer decode;
- beam (``--beam-size``, ``--len-penalty`` as HF's ``length_penalty``, and 0): identical lines; each
  differing line is attributed by scoring both outputs with aiayn's model (``attribute``): the length
  penalty (GNMT's ((5+|Y|)/6)**a vs HF's |Y|**a), HF's forced EOS at the length cap (scored 0 where
  aiayn counts its log-probability), or one side's search;
- CTranslate2: ``TransformersConverter`` on the exported folder as shipped (4.8.5), then with its
  Marian loader's two conventions overridden one at a time (the last vocabulary row dropped as
  Marian's trailing <pad>; decoding started from a zero embedding), each against
  ``aiayn.export.ctranslate2.AiaynConverter``: greedy lines identical (float32 and int8) and max |score|
  difference of the references (float32).

Prints a markdown table; ``--out`` also writes it. Exit status 1 when greedy parity is below 99.5 %
or the teacher-forced difference above 1e-4 (the export's acceptance bar), else 0. Results: docs/results.md,
"Hugging Face Marian export: parity".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from aiayn.data.batching import pad_batch
from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, load_params
from aiayn.data.readers import read_lines
from aiayn.inference.search import length_penalty
from aiayn.export.hf_marian import export_marian, marian_logprobs, marian_translate_ids
from aiayn.inference.runtimes import DecodeOptions
from aiayn.inference.translator import Translator
from benchmarks.harness import markdown_table

GREEDY_MIN, LOGPROB_MAX = 0.995, 1e-4


def read_split(args) -> tuple[list[str], list[str]]:
    if args.source:
        return read_lines(Path(args.source)), read_lines(Path(args.reference))
    base = Path(args.mirror)
    src, ref = (base / f"{args.split}.{lang}.gz" for lang in (args.src_lang, args.tgt_lang))
    return read_lines(src), read_lines(ref)


def batches(n: int, size: int):
    for i in range(0, n, size):
        yield slice(i, min(n, i + size))


def teacher_forced(tr: Translator, hf, srcs: list[np.ndarray], refs: list[list[int]]) -> tuple[float, float]:
    """(max, mean) |log p_HF - log p_aiayn| over every non-pad target position and vocabulary entry."""
    worst, total, count = 0.0, 0.0, 0
    for s in batches(len(srcs), 32):
        src = pad_batch(srcs[s])
        tgt_in = pad_batch([np.asarray([BOS_ID] + r, dtype=np.int64) for r in refs[s]])
        with torch.inference_mode():
            ours = torch.log_softmax(tr.decoder.model(src, tgt_in).float(), dim=-1)
        diff = (marian_logprobs(hf, src, tgt_in) - ours).abs()[tgt_in.ne(PAD_ID)]  # (N, V)
        worst, total, count = max(worst, diff.max().item()), total + diff.sum().item(), count + diff.numel()
    return worst, total / count


def sequence_logprob(tr: Translator, src: np.ndarray, hyp: list[int]) -> tuple[float, float]:
    """aiayn's log-probability of ``hyp`` given ``src``: (sum over its tokens, EOS after them)."""
    tgt = torch.as_tensor([[BOS_ID] + hyp], dtype=torch.long)
    gold = torch.as_tensor(hyp + [EOS_ID], dtype=torch.long)
    with torch.inference_mode():
        lp = torch.log_softmax(tr.decoder.model(torch.as_tensor(src[None]), tgt).float(), dim=-1)[0]
    per_token = lp.gather(1, gold[:, None])[:, 0]
    return per_token[:-1].sum().item(), per_token[-1].item()


def attribute(tr: Translator, srcs, ours, theirs, alpha: float, opts: DecodeOptions) -> dict[str, int]:
    """Why each differing beam line differs, judged by aiayn's model scoring both outputs the way
    each search does. aiayn: (tokens + EOS) / ((5 + |Y|) / 6) ** alpha. HF: (tokens + EOS) / |Y| ** alpha,
    where an EOS forced at the length cap (``forced_eos_token_id``) scores 0, not its log-probability.
    ``length penalty`` / ``forced EOS at the cap``: each output is the better one under its own rule
    (and that rule, resp. the forced EOS, is what tips it); ``aiayn search`` / ``HF search``: the other
    side's output is better even under this side's own rule (a search miss)."""
    why = {"length penalty": 0, "forced EOS at the cap": 0, "aiayn search": 0, "HF search": 0}
    for s, a, b in zip(srcs, ours, theirs):
        if a == b:
            continue
        cap = int(opts.max_len_a * len(s) + opts.max_len_b)
        (ta, ea), (tb, eb) = sequence_logprob(tr, s, a), sequence_logprob(tr, s, b)
        ours_a, ours_b = (ta + ea) / length_penalty(len(a) + 1, alpha), (tb + eb) / length_penalty(len(b) + 1, alpha)

        def hf(t: float, e: float, n: int, forced: bool) -> float:
            return (t + (0.0 if forced and n >= cap else e)) / (n + 1) ** alpha

        if ours_a >= ours_b and hf(tb, eb, len(b), True) >= hf(ta, ea, len(a), True):
            tipped_by_penalty = hf(tb, eb, len(b), False) >= hf(ta, ea, len(a), False)
            why["length penalty" if tipped_by_penalty else "forced EOS at the cap"] += 1
        elif ours_b > ours_a:
            why["aiayn search"] += 1
        else:
            why["HF search"] += 1
    return why


def same(a, b) -> float:
    return sum(x == y for x, y in zip(a, b)) / max(1, len(a))


@contextlib.contextmanager
def marian_loader(keep_last_row: bool, start_from_bos: bool):
    """CTranslate2's Marian loader with its conventions overridden (restored on exit)."""
    from ctranslate2.converters import transformers as ct2t

    L = ct2t.MarianMTLoader
    saved = L._remove_pad_weights, L.set_decoder, L.set_config
    if keep_last_row:  # Marian's vocabularies end with <pad>, which the loader drops; ours ends with a piece
        L._remove_pad_weights = lambda self, spec: None
    if start_from_bos:  # Marian starts from a zero vector; our decoder starts from BOS's trained embedding
        L.set_decoder = lambda self, spec, decoder: ct2t.BartLoader.set_decoder(self, spec, decoder)
        L.set_config = lambda self, config, model, tokenizer: ct2t.BartLoader.set_config(self, config, model, tokenizer)
    try:
        yield
    finally:
        L._remove_pad_weights, L.set_decoder, L.set_config = saved


def ct2_rows(tr: Translator, hf_dir: Path, tmp: Path, srcs, refs, greedy: DecodeOptions) -> list[tuple[str, str]]:
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    from aiayn.export.ctranslate2 import AiaynConverter
    from aiayn.inference.runtimes import CT2Decoder

    pieces = [tr.tokenizer.id_to_piece(i) for i in range(tr.tokenizer.vocab_size)]
    P = tr.max_side_tokens

    def decode(d: Path, ct: str):
        return CT2Decoder(d, tr.tokenizer, max_side_tokens=P, compute_type=ct).translate_ids(srcs, greedy)

    def scores(d: Path) -> np.ndarray:
        t = ctranslate2.Translator(str(d), compute_type="float32")
        out = t.score_batch([[pieces[i] for i in s] for s in srcs], [[pieces[i] for i in r] for r in refs])
        return np.array([sum(r.log_probs) for r in out])

    ours = tmp / "ct2-aiayn"
    AiaynConverter(tr.decoder.model, tr.tokenizer).convert(str(ours), force=True)
    ref = {ct: decode(ours, ct) for ct in ("float32", "int8")}
    ref_scores = scores(ours)
    rows = []
    for name, keep, bos in (("as shipped", False, False), ("+ keep the last vocabulary row", True, False),
                            ("+ start from BOS's embedding", True, True)):
        d = tmp / f"ct2-{keep}-{bos}"
        try:
            with marian_loader(keep, bos):
                TransformersConverter(str(hf_dir)).convert(str(d), force=True)
        except Exception as e:  # noqa: BLE001 - the failure is the measurement
            rows.append((f"ct2 stock converter {name}", f"conversion fails: {type(e).__name__}: {e}"))
            continue
        f32, i8 = same(ref["float32"], decode(d, "float32")), same(ref["int8"], decode(d, "int8"))
        delta = np.abs(scores(d) - ref_scores).max()
        rows.append((f"ct2 stock converter {name}",
                     f"greedy = AiaynConverter: float32 {f32:.1%}, int8 {i8:.1%}; max abs sentence score diff {delta:.2e}"))
    return rows


def measure(args) -> tuple[list[tuple[str, str]], bool]:
    from transformers import AutoTokenizer, MarianMTModel

    tr = Translator.from_dir(args.model_dir, device="cpu")
    sources, references = read_split(args)
    if args.lines:
        sources, references = sources[: args.lines], references[: args.lines]
    beam = DecodeOptions(beam_size=args.beam_size, len_penalty=args.len_penalty, max_len_a=args.max_len_a,
                         max_len_b=args.max_len_b)
    greedy = DecodeOptions(beam_size=1, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    rows = [("model", f"{args.model_dir}: {tr.decoder.model.cfg.model_dump(exclude_defaults=True)}"),
            ("sentences", f"{len(sources)} ({args.split if not args.source else args.source})")]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        hf_dir = export_marian(args.model_dir, tmp / "hf", decode=beam, src_lang=args.src_lang, tgt_lang=args.tgt_lang)
        rows.append(("export time", f"{time.perf_counter() - t0:.1f} s"))
        hf = MarianMTModel.from_pretrained(hf_dir).eval()
        tok = AutoTokenizer.from_pretrained(hf_dir)
        srcs = tr.encode(sources, greedy)
        refs = [ids[: tr.max_side_tokens - 1] for ids in tr.tokenizer.encode(references)]
        hf_ids = tok(sources).input_ids
        rows.append(("tokens: MarianTokenizer == aiayn", f"{same([list(s) for s in srcs], hf_ids):.1%} of lines"))
        worst, mean = teacher_forced(tr, hf, srcs, refs)
        rows.append(("teacher-forced log-prob, abs(HF - aiayn)", f"max {worst:.2e}, mean {mean:.2e}"))
        ours_g, hf_g = tr.decoder.translate_ids(srcs, greedy), marian_translate_ids(hf, srcs, greedy)
        greedy_same = same(ours_g, hf_g)
        rows.append(("greedy, token for token", f"{greedy_same:.2%} identical"))
        texts = tok.batch_decode([[BOS_ID] + h + [EOS_ID] for h in hf_g], skip_special_tokens=True)
        rows.append(("greedy, text (HF tokenizer decode)", f"{same(tr.output_lines([(i, i + 1) for i in range(len(srcs))], ours_g), texts):.2%} identical"))
        for alpha in dict.fromkeys((args.len_penalty, 0.0)):
            opts = DecodeOptions(beam_size=args.beam_size, len_penalty=alpha, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
            ours_b, hf_b = tr.decoder.translate_ids(srcs, opts), marian_translate_ids(hf, srcs, opts)
            why = attribute(tr, srcs, ours_b, hf_b, alpha, opts)
            rows.append((f"beam {args.beam_size}, len_penalty {alpha}",
                         f"{same(ours_b, hf_b):.2%} identical; differing lines: {why}"))
        if not args.skip_ct2:
            rows += ct2_rows(tr, hf_dir, tmp, srcs, refs, greedy)
    ok = greedy_same >= GREEDY_MIN and worst <= LOGPROB_MAX
    return rows, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=Path("artifacts/model"))
    ap.add_argument("--mirror", default=os.environ.get("AIAYN_DATA_MIRROR", "data/multi30k"),
                    help="Corpus folder with <split>.<lang>.gz (default: $AIAYN_DATA_MIRROR, else data/multi30k).")
    ap.add_argument("--split", default="test_2016_flickr")
    ap.add_argument("--source", help="Source text file instead of the mirror's split (needs --reference).")
    ap.add_argument("--reference")
    ap.add_argument("--params", type=Path, default=None, help="params.yaml for languages (default: en->de).")
    ap.add_argument("--lines", type=int, default=None, help="Only the first N lines.")
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--len-penalty", type=float, default=0.6)
    ap.add_argument("--max-len-a", type=float, default=1.0)
    ap.add_argument("--max-len-b", type=int, default=50)
    ap.add_argument("--skip-ct2", action="store_true", help="Leave out the CTranslate2 rows.")
    ap.add_argument("--out", type=Path, help="Also write the table here.")
    args = ap.parse_args(argv)
    if bool(args.source) != bool(args.reference):
        ap.error("--source and --reference go together")
    p = load_params(args.params) if args.params else None
    args.src_lang, args.tgt_lang = (p.data.src_lang, p.data.tgt_lang) if p else ("en", "de")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.perf_counter()
    rows, ok = measure(args)
    import transformers

    lines = [f"HF Marian parity, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, transformers "
             f"{transformers.__version__}, torch {torch.__version__}, {time.perf_counter() - t0:.0f} s", "",
             markdown_table(["measurement", "result"], rows)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    if not ok:
        print(f"FAILED: greedy identical < {GREEDY_MIN:.1%} or teacher-forced difference > {LOGPROB_MAX}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
