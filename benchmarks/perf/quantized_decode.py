"""Quantized decoding against the eager float model, side by side: BLEU, delta, bytes, throughput ratios.

    python benchmarks/perf/quantized_decode.py --model-dir artifacts/model --split artifacts/prepared/test_2016_flickr \
        --rounds 5 --threads 1 2

Builds ct2-float32 / ct2-int8 / ct2-int16 from the bundle (CPU), scores each on ``--sentences`` lines
of the split (beam ``--beam``), then times eager and every variant in alternating rounds (eager, v1,
v2, ..., eager, v1, ...), beam 4, batch 1 and batch 32, for each thread count, and prints the
median and min-max of sentences/s ratios vs. eager. ``--demo`` uses a randomly initialised tiny
model over artifacts/tokenized/spm.model instead of a trained bundle (numbers only show the plumbing).
The quantize stage measures the same variants in its throughput phase (``artifacts/quantize_throughput.json``);
the published table: docs/results.md, "Eager beam search against CTranslate2".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from aiayn.inference.artifacts import EAGER, ModelBundle
from aiayn.checkpoint import save_model
from aiayn.config.schema import model_preset
from aiayn.data.readers import read_lines
from aiayn.inference.runtimes import CT2Decoder, DecodeOptions, EagerDecoder
from aiayn.model import Transformer
from aiayn.quantize.throughput import measure, thread_count
from aiayn.quantize.variants import VARIANTS, build_ct2, dir_bytes
from aiayn.evaluation.scoring import score
from aiayn.tokenizer import Tokenizer
from aiayn.inference.translator import Translator
from benchmarks.harness import Spread, host_line, markdown_table, ratios


def demo_bundle(out: Path, spm: Path) -> Path:
    tok = Tokenizer.load(spm)
    torch.manual_seed(0)
    model = Transformer(model_preset("tiny", vocab_size=tok.vocab_size))
    out.mkdir(parents=True, exist_ok=True)
    save_model(out / "model.safetensors", model.state_dict())
    (out / "model.json").write_text(json.dumps({"model": model.cfg.model_dump(mode="json")}))
    (out / "spm.model").write_bytes(spm.read_bytes())
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=Path("artifacts/model"))
    ap.add_argument("--split", default="artifacts/prepared/test_2016_flickr", help="prefix of {split}.en / {split}.de")
    ap.add_argument("--sentences", type=int, default=1000, help="lines scored for BLEU")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--max-len-b", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch1-sentences", type=int, default=50)
    ap.add_argument("--batch32-sentences", type=int, default=200)
    ap.add_argument("--demo", action="store_true", help="random tiny model over artifacts/tokenized/spm.model")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="aiayn-qbench-"))
    model_dir = demo_bundle(tmp / "model", Path("artifacts/tokenized/spm.model")) if args.demo else args.model_dir
    bundle = ModelBundle.load(model_dir, device="cpu")
    model, tok = bundle.model, bundle.tokenizer
    src_lines = read_lines(Path(f"{args.split}.en"))[: args.sentences]
    refs = read_lines(Path(f"{args.split}.de"))[: args.sentences]
    sources = Translator(tok, EagerDecoder(model)).encode(src_lines)
    opts = DecodeOptions(beam_size=args.beam, max_len_b=args.max_len_b)

    engines = {EAGER: None}
    bleu, size = {}, {EAGER: (model_dir / "model.safetensors").stat().st_size}
    for name in ("ct2-float32", "ct2-int8", "ct2-int16"):
        v = VARIANTS[name]
        build_ct2(v, model, tok, tmp / name, model_dir / "spm.model")
        engines[name] = v
        size[name] = dir_bytes(tmp / name) - (tmp / name / "spm.model").stat().st_size

    def decoder(name: str, threads: int, batch: int | None):
        if name == EAGER:
            return lambda s: EagerDecoder(model).translate_ids(s, opts, batch_size=batch)
        tr = CT2Decoder(tmp / name, tok, max_side_tokens=model.max_side_tokens,
                        compute_type=engines[name].compute_type, intra_threads=threads)
        return lambda s: tr.translate_ids(s, opts, batch_size=batch)

    for name in engines:
        with thread_count(max(args.threads)):
            out = decoder(name, max(args.threads), None)(sources)
        bleu[name] = score(tok.decode(out), refs)["bleu"]

    speed: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for threads in args.threads:
            for batch, n in ((1, args.batch1_sentences), (32, args.batch32_sentences)):
                for name in engines:  # alternating: every engine once per round
                    with thread_count(threads):
                        m = measure(decoder(name, threads, batch), sources[:n])
                    speed.setdefault((name, f"b{batch}/t{threads}"), []).append(m["sentences_per_s"])

    keys = sorted({k for _, k in speed})
    print(f"model: {model_dir} ({'random demo' if args.demo else 'trained'}), {len(sources)} sentences, beam {args.beam}, "
          f"{args.rounds} rounds; throughput = sentences/s ratio vs eager, median (min-max)")
    print(host_line())
    rows = []
    for name in engines:
        cells = []
        for k in keys:
            vs_eager = Spread.of(ratios(speed[(name, k)], speed[(EAGER, k)]))
            cells.append(f"{vs_eager.median:.2f}x ({vs_eager.low:.2f}-{vs_eager.high:.2f})"
                         + (f" [{Spread.of(speed[(EAGER, k)]).median:.1f} sent/s]" if name == EAGER else ""))
        rows.append([name, f"{bleu[name]:.2f}", f"{bleu[name] - bleu[EAGER]:+.2f}", f"{size[name]:,}", *cells])
    print(markdown_table(["variant", "BLEU", "delta", "bytes", *keys], rows, "lrrr" + "r" * len(keys)))


if __name__ == "__main__":
    sys.exit(main())
