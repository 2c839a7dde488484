"""Which weights to ship, measured on the test sets: every ``train.select`` method on one finished run's checkpoints.

The train stage ships one choice (``train.select``) and validates it; this asks what the others would
have scored on the test sets, e.g. whether averaging the last epoch checkpoints (Wu et al. 2021's
``average_checkpoints.py --num-epoch-checkpoints 10``; the paper's Section 6.1 averages the last 5
or 20) helps or hurts against the final or the best single checkpoint. For each method it runs
``aiayn.train.select_weights`` as the train stage does (same checkpoints on disk, candidates scored on
the validation split with ``select.metric``) but with ``guard: warn``, so each method's own choice is
measured, then decodes every test split with the ``evaluate`` parameters (beam, length rules) and scores
it with sacreBLEU and, when ``evaluate.moses_bleu``, fairseq's lowercased-tokenized convention
(``aiayn.evaluation.moses_bleu``). Run it in the project that trained (its ``artifacts/checkpoints``,
``artifacts/tokenized``, ``artifacts/prepared`` and ``artifacts/model``):

    python benchmarks/studies/checkpoint_choice.py --root . --params configs/multi30k_wu2021.yaml \\
        [--methods last,average_last,best,average_best] [--splits test_2016_flickr] [--threads 2]

Prints a Markdown table (one row per method) and the host line (2-thread fp32 matmul GFLOP/s). Results:
docs/studies/checkpoint-choice.md.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks.harness import host_line, markdown_row, markdown_table


def _test_scores(root: Path, params, weights: dict[str, torch.Tensor], splits: list[str]) -> dict[str, dict]:
    """Decode and score ``splits`` with ``weights`` in the trained model's folder, as the evaluate stage does."""
    from aiayn.checkpoint import save_model
    from aiayn.data.readers import read_lines
    from aiayn.inference.runtimes import DecodeOptions
    from aiayn.stages import Layout
    from aiayn.stages.evaluate import decode_split, score_split
    from aiayn.inference.translator import Translator

    layout, d, e = Layout(root), params.data, params.evaluate
    options = DecodeOptions.from_eval(e)
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.safetensors"
        save_model(path, weights)  # tied embeddings stored once, as the train stage writes model.safetensors
        translator = Translator.from_dir(layout.model, weights=path, device="cpu")
        for split in splits:
            sources = read_lines(layout.prepared / f"{split}.{d.src_lang}")
            references = read_lines(layout.prepared / f"{split}.{d.tgt_lang}")
            hyps = decode_split(translator, sources, options, e.long_policy)
            out[split] = score_split(params, layout, split, hyps, references)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("."))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--methods", default="last,average_last,best,average_best")
    ap.add_argument("--splits", default=None, help="comma-separated (default: data.test_splits)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from aiayn.config.schema import load_params
    from aiayn.model import Transformer
    from aiayn.stages import Layout
    from aiayn.stages.train import weights_evaluator  # the stage's own: candidates scored exactly as in training
    from aiayn.stages.train_job import bleu_validator, load_train_inputs
    from aiayn.train import select_weights

    root = args.root.resolve()
    params = load_params(args.params if args.params.is_absolute() else root / args.params)
    layout = Layout(root)
    splits = args.splits.split(",") if args.splits else list(params.data.test_splits)
    inputs = load_train_inputs(params, layout)
    model = Transformer(inputs.model_cfg).eval()
    scorer = bleu_validator(params, layout, inputs) if params.train.select.metric == "valid_bleu" else None
    evaluate = weights_evaluator(model, params, inputs.valid_split, scorer)
    metric = params.train.select.metric
    moses = params.evaluate.moses_bleu
    rows = [markdown_table(["method", "checkpoints (steps)", metric,
                            *(f"{s} BLEU" + (" / lc-tok" if moses else "") for s in splits)], [])]
    for method in args.methods.split(","):
        select = params.train.select.model_copy(update={"method": method, "guard": "warn"})
        cfg = params.train.model_copy(update={"select": select})
        sel = select_weights(layout.checkpoints, cfg, evaluate)
        scores = _test_scores(root, params, sel.weights, splits)
        steps = f"{len(sel.steps)}: {sel.steps[0]}" + (f"-{sel.steps[-1]}" if len(sel.steps) > 1 else "")
        cells = [f"{scores[s]['bleu']:.2f}" + (f" / {scores[s]['bleu_moses_lc_tok']:.2f}" if moses else "")
                 for s in splits]
        rows.append(markdown_row([method, steps, f"{sel.value:.4f}", *cells]))
        print(rows[-1], flush=True)
    print()
    print("\n".join(rows))
    print(f"\nbeam {params.evaluate.beam_size}, len_penalty {params.evaluate.len_penalty} "
          f"({params.evaluate.length_norm}); {metric} on {params.data.valid_split}; {host_line()}")


if __name__ == "__main__":
    main()
