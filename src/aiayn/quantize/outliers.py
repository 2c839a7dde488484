"""Activation outliers per Linear input channel (the LLM.int8 view of why int8 may hurt).

Forward hooks on every ``nn.Linear`` of the eager model (and on the input of the tied output
projection) record ``|x|`` of each input channel over a teacher-forced calibration slice of
training pairs. Per layer: per-channel max and median, the layer median (median over all
activations of that layer) and the channels whose max exceeds ``factor`` x the layer median
(Dettmers et al. 2022 use an absolute 6.0 on LLM scales; here the criterion is relative).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from aiayn.data.batching import pad_batch
from aiayn.config.schema import BOS_ID
from aiayn.model import Transformer

__all__ = ["LayerStats", "activation_stats", "write_report"]


@dataclass(frozen=True)
class LayerStats:
    layer: str
    in_features: int
    layer_median: float
    max_abs: float
    outlier_channels: int
    top_channel: int
    top_ratio: float  # max channel max / layer median
    channel_max: np.ndarray  # (in_features,)
    channel_median: np.ndarray  # (in_features,)


@torch.inference_mode()
def activation_stats(
    model: Transformer,
    sources: list[np.ndarray],
    targets: list[np.ndarray],
    *,
    factor: float = 6.0,
    batch_size: int = 32,
) -> list[LayerStats]:
    """Per-Linear input statistics over (source with EOS, target without BOS/EOS) pairs."""
    model.eval()
    acts: dict[str, list[torch.Tensor]] = {}
    hooks = []

    def keep(name: str):
        def hook(_module, inputs, output=None):
            x = inputs[0] if output is None else output
            acts.setdefault(name, []).append(x.reshape(-1, x.shape[-1]).abs().float())

        return hook

    masks: list[torch.Tensor] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            hooks.append(module.register_forward_pre_hook(keep(name)))
    hooks.append(model.decoder_norm.register_forward_hook(lambda m, i, o: keep("decoder.projection")(m, i, o)))
    try:
        for start in range(0, len(sources), batch_size):
            src = pad_batch(sources[start : start + batch_size])
            tgt_in = pad_batch([np.concatenate([[BOS_ID], t]) for t in targets[start : start + batch_size]])
            model(src, tgt_in)
            masks.append((src != 0, tgt_in != 0))
    finally:
        for h in hooks:
            h.remove()

    # Keep only real (non-pad) positions: encoder-side inputs follow src, decoder-side tgt_in.
    def valid(name: str, chunks: list[torch.Tensor]) -> torch.Tensor:
        enc_side = name.startswith("encoder_layers") or (".cross_attn.k_proj" in name or ".cross_attn.v_proj" in name)
        rows = []
        for x, (sm, tm) in zip(chunks, masks):
            m = (sm if enc_side else tm).reshape(-1)
            rows.append(x[m] if m.numel() == x.shape[0] else x)
        return torch.cat(rows)

    stats = []
    for name, chunks in acts.items():
        x = valid(name, chunks)  # (N, in)
        ch_max = x.amax(dim=0).numpy()
        ch_med = x.median(dim=0).values.numpy()
        layer_med = float(x.median())
        thr = factor * max(layer_med, 1e-12)
        top = int(ch_max.argmax())
        stats.append(LayerStats(
            layer=name, in_features=x.shape[1], layer_median=layer_med, max_abs=float(ch_max.max()),
            outlier_channels=int((ch_max > thr).sum()), top_channel=top, top_ratio=float(ch_max[top] / max(layer_med, 1e-12)),
            channel_max=ch_max, channel_median=ch_med,
        ))  # fmt: skip
    return stats


def write_report(stats: list[LayerStats], out_dir: Path, *, factor: float) -> list[Path]:
    """``outliers.csv`` (one row per layer and channel), ``outliers.md`` (one row per layer) and
    ``outliers.png`` (if matplotlib is installed) in ``out_dir``; returns the written paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["layer", "channel", "max_abs", "median_abs", "ratio_to_layer_median", "outlier"])
    for s in stats:
        for c in range(s.in_features):
            ratio = s.channel_max[c] / max(s.layer_median, 1e-12)
            w.writerow([s.layer, c, f"{s.channel_max[c]:.6g}", f"{s.channel_median[c]:.6g}", f"{ratio:.4g}", int(ratio > factor)])
    paths = [out_dir / "outliers.csv"]
    paths[0].write_text(buf.getvalue(), encoding="utf-8")
    lines = [
        f"# Activation outliers per Linear input channel (channel max > {factor:g} x layer median)\n",
        "| layer | in | layer median | max abs | outlier channels | top channel (ratio) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for s in stats:
        lines.append(f"| {s.layer} | {s.in_features} | {s.layer_median:.4g} | {s.max_abs:.4g} | {s.outlier_channels} "
                     f"| {s.top_channel} ({s.top_ratio:.1f}x) |")
    paths.append(out_dir / "outliers.md")
    paths[1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return paths
    fig, ax = plt.subplots(figsize=(10, max(4, 0.22 * len(stats))))
    names = [s.layer for s in stats]
    y = np.arange(len(stats))
    ax.barh(y, [s.top_ratio for s in stats], color=["tab:red" if s.outlier_channels else "tab:blue" for s in stats])
    ax.axvline(factor, color="k", linestyle="--", linewidth=1, label=f"{factor:g}x layer median")
    ax.set_yticks(y, names, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("max channel |activation| / layer median |activation|")
    ax.set_title("Linear input-channel outliers (red: layer has outlier channels)")
    ax.legend()
    fig.tight_layout()
    png = out_dir / "outliers.png"
    fig.savefig(png, dpi=100, metadata={"Software": None})
    plt.close(fig)
    paths.append(png)
    return paths
