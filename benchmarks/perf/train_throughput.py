"""Training throughput of aiayn's Transformer vs ``torch.nn.Transformer``, same dims, same batches.

Both models get the same length-bucketed batches (real Multi30k token lengths
when ``artifacts/tokenized`` exists, else Multi30k-shaped synthetic ones), the
same loss (label-smoothed CE) and the same optimizer (Adam), the same bare step
(``benchmarks/train_steps.py``). The two are run in alternating rounds in one process so machine
noise hits both alike; the table reports medians and the ratio ours / reference. Results:
docs/results.md, "Against torch.nn.Transformer, and the loop against the bare step".

    python benchmarks/perf/train_throughput.py [--preset tiny] [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from aiayn.data.batching import collate, make_batches
from aiayn.config.schema import PAD_ID, model_preset
from aiayn.model import Transformer
from aiayn.model.positions import sinusoid_table
from aiayn.tokenizer import EncodedSplit, load_encoded
from benchmarks.harness import Spread, alternate, host_line, markdown_table, ratios
from benchmarks.train_steps import run_steps


class TorchReference(nn.Module):
    """``torch.nn.Transformer`` doing the same work as aiayn's post-norm model, no more, no less.

    Same dims, tied embeddings scaled by sqrt(d_model), the same sinusoid table (interleaved
    sin/cos), dropout only where ours has it (embeddings + every residual branch): attention
    dropout and the FFN's inner dropout are set to 0 (ours has neither; ``attention_dropout``
    defaults to 0), the two final stack LayerNorms that ``nn.Transformer`` adds are removed
    (post-norm has none), and every mask is boolean (no float ``-inf`` masks to add).
    """

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, d_ff: int, n_layers: int, dropout: float) -> None:
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.core = nn.Transformer(d_model, n_heads, n_layers, n_layers, d_ff, dropout, batch_first=True)
        self.core.encoder.norm = None  # post-norm: no final LayerNorm per stack
        self.core.decoder.norm = None
        for layer in [*self.core.encoder.layers, *self.core.decoder.layers]:
            layer.dropout = nn.Identity()  # FFN inner dropout: not in ours (nor in the paper)
            for attn in (getattr(layer, "self_attn", None), getattr(layer, "multihead_attn", None)):
                if attn is not None:
                    attn.dropout = 0.0  # attention dropout: ours defaults to 0
        self.emb_dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoid_table(1024, d_model))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        def emb(x: torch.Tensor) -> torch.Tensor:
            return self.emb_dropout(self.embed(x) * self.d_model**0.5 + self.pe[: x.size(1)])

        t = tgt_in.size(1)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # True = masked, as nn.Transformer's bool masks
        h = self.core(emb(src), emb(tgt_in), tgt_mask=causal, tgt_is_causal=True,
                      src_key_padding_mask=src == PAD_ID, tgt_key_padding_mask=tgt_in == PAD_ID,
                      memory_key_padding_mask=src == PAD_ID)
        return h @ self.embed.weight.T  # (B, T, V)


def synthetic_multi30k(n: int, vocab: int, seed: int = 0) -> EncodedSplit:
    rng = np.random.default_rng(seed)
    src_len = np.clip(rng.normal(15, 5, n).astype(int), 3, 45)
    tgt_len = np.clip((src_len * rng.normal(1.1, 0.15, n)).astype(int), 3, 50)

    def pack(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return rng.integers(4, vocab, int(offsets[-1])).astype(np.int32), offsets

    (s, so), (t, to) = pack(src_len), pack(tgt_len)
    return EncodedSplit(src_ids=s, src_offsets=so, tgt_ids=t, tgt_offsets=to)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20, help="batches per timed round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokenized", type=Path, default=Path("artifacts/tokenized"))
    args = ap.parse_args()

    if (args.tokenized / "train.src.ids.npy").exists():
        split, source = load_encoded(args.tokenized, "train"), f"Multi30k train ({args.tokenized})"
        args.vocab_size = int(max(split.src_ids.max(), split.tgt_ids.max())) + 1
    else:
        split, source = synthetic_multi30k(29000, args.vocab_size), "synthetic, Multi30k-shaped lengths"
    cfg = model_preset(args.preset, vocab_size=args.vocab_size, attention_backend="sdpa")
    order = make_batches(split.src_lengths, split.tgt_lengths, args.max_tokens, data_seed=1, epoch=1)
    batches = [collate(split, idx) for idx in order[: args.steps]]
    warm = [collate(split, idx) for idx in order[args.steps: args.steps + 3]]

    torch.manual_seed(0)
    ours = Transformer(cfg)
    torch.manual_seed(0)
    ref = TorchReference(cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.dropout)
    models = {"aiayn Transformer": ours, "torch.nn.Transformer": ref}
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9) for k, m in models.items()}
    for k, m in models.items():
        run_steps(m, warm, opts[k])

    def rate(k: str) -> float:
        seconds, tokens = run_steps(models[k], batches, opts[k])
        return tokens / seconds

    rates = alternate({k: (lambda k=k: rate(k)) for k in models}, args.rounds)
    vs_torch = Spread.of(ratios(rates["aiayn Transformer"], rates["torch.nn.Transformer"]))
    print(f"preset={args.preset} d_model={cfg.d_model} n_heads={cfg.n_heads} d_ff={cfg.d_ff} n_layers={cfg.n_layers} "
          f"vocab={cfg.vocab_size} max_tokens={args.max_tokens}; data: {source}; "
          f"{args.steps} steps x {args.rounds} rounds; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(host_line())
    print()
    rows = []
    for k, m in models.items():
        tps = Spread.of(rates[k])
        rows.append([k, f"{sum(p.numel() for p in m.parameters()) / 1e6:.2f}M", f"{tps.median:.0f}",
                     f"{tps.low:.0f}-{tps.high:.0f}", f"{vs_torch:.2f}" if k == "aiayn Transformer" else "1.00"])
    print(markdown_table(["model", "params", "target tokens/s (median)", "min-max",
                          "ratio vs torch.nn.Transformer (median, min-max of per-round ratios)"], rows))


if __name__ == "__main__":
    main()
