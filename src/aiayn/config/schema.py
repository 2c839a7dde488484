"""Typed configuration: presets, ``params.yaml`` loading and validation.

Every knob the pipeline reads lives here, documented, with its default. The
paper's values are the defaults of the ``base``/``big`` presets (Vaswani et al.
2017, "Attention Is All You Need", Table 3 and Section 5); the ``tiny`` preset
is the CPU default and says where and why it deviates.

``params.yaml`` (what DVC tracks) has one block per stage::

    data:      DataConfig
    tokenize:  TokenizerConfig
    model:     {preset: tiny, <any ModelConfig field as override>}
    train:     TrainConfig
    evaluate:  EvalConfig
    quantize:  QuantizeConfig
    monitor:   MonitorConfig   (drift monitor; read by no training stage)
    export:    ExportConfig    (extra formats the export stage writes)
    adapt:     AdaptConfig     (the adapt flow's trigger and promotion gate; aiayn.config.adaptation)

Errors: ``ConfigError`` (a ``ValueError``) quoting the bad key or value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from aiayn.config.adaptation import AdaptConfig
from aiayn.config.finetune import FinetuneConfig, is_registry_uri, registry_parts

__all__ = [
    "ConfigError",
    "CORPUS_KINDS",
    "CorpusConfig",
    "DataConfig",
    "registered_model_name",
    "corpus_identity",
    "TokenizerConfig",
    "ModelConfig",
    "TrainConfig",
    "ValidBleuConfig",
    "EarlyStopConfig",
    "SelectConfig",
    "EvalConfig",
    "QuantizeConfig",
    "QUANT_VARIANTS",
    "MonitorConfig",
    "EMBEDDING_DRIFT_METHODS",
    "ExportConfig",
    "EXPORT_FORMATS",
    "Params",
    "MODEL_PRESETS",
    "model_preset",
    "load_params",
    "PAD_ID",
    "UNK_ID",
    "BOS_ID",
    "EOS_ID",
]

# Special token ids, fixed for every sentencepiece model this project trains.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

AttentionBackend = Literal["auto", "sdpa", "reference", "triton"]


class ConfigError(ValueError):
    """A configuration value or file is invalid; the message names it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: Corpus source kinds (``aiayn.data.sources``): the built-in Multi30k, local files in three layouts,
#: a Hugging Face ``datasets`` dataset.
CORPUS_KINDS = ("multi30k", "moses", "tsv", "jsonl", "hf")

#: Where ``aiayn fetch`` puts Multi30k (the ``multi30k`` source's default ``path``).
MULTI30K_DIR = "data/multi30k"
#: The default ``path`` of a hub source (``hf`` with ``name``): a hub dataset has no local files, so
#: the ``corpus`` stage watches the module that downloads it (its params pin name, config, revision).
HUB_WATCH = "src/aiayn/data/hub.py"


class CorpusConfig(_Strict):
    """Where the parallel text comes from (``corpus`` stage, ``aiayn.data.sources``).

    ``kind``:

    ``multi30k``  the built-in, checksummed Multi30k task 1 (en, de, fr, cs) in ``path``
                  (``aiayn fetch`` puts it in ``data/multi30k``)
    ``moses``     one sentence per line, one file per language: ``{path}/{split}.{lang}[.gz]``, or
                  ``splits: {split: prefix}`` for ``{prefix}.{lang}[.gz]``
    ``tsv``       ``{path}/{split}.tsv[.gz]`` (or ``splits: {split: file}``); two columns (source,
                  target) or, with ``columns`` / ``header``, named columns picked by language code
    ``jsonl``     ``{path}/{split}.jsonl[.gz]`` (or ``splits: {split: file}``), one
                  ``{"translation": {"en": ..., "de": ...}}`` object per line (Hugging Face's shape)
    ``hf``        ``datasets.load_dataset(name or path, config, revision=revision)``; ``splits`` maps
                  our split names to the dataset's (``{val: validation, newstest2014: test}``)

    ``path`` is relative to the project root (or absolute) and is what DVC watches: the ``corpus``
    stage's ``deps`` hold ``${data.corpus.path}``, so an edit of a local corpus re-runs it.
    ``sacrebleu``: test splits taken from sacreBLEU's test sets instead, ``{split: test set}``
    (e.g. ``{newstest2014: wmt14}``; downloaded by sacreBLEU, so online or already cached).
    """

    kind: Literal["multi30k", "moses", "tsv", "jsonl", "hf"] = "multi30k"
    path: str | None = Field(None, description="Local folder or file of the corpus (multi30k: data/multi30k; "
                             "hf: a local dataset folder; a hub dataset keeps the default).")
    name: str | None = Field(None, description="hf: the hub dataset (e.g. wmt/wmt14); None: load ``path``.")
    config: str | None = Field(None, description="hf: the dataset configuration (e.g. de-en).")
    revision: str | None = Field(None, description="hf: the hub revision (commit, tag or branch); the resolved "
                                 "one is recorded in artifacts/corpus/SOURCE.json.")
    splits: dict[str, str] = Field(default_factory=dict, description="Our split name -> the source's file, "
                                   "prefix (moses) or split name (hf); unlisted splits use the default layout.")
    columns: tuple[str, ...] | None = Field(None, description="tsv: names of the columns (languages picked by "
                                            "name); None: the header row with header: true, else exactly two "
                                            "columns, source then target.")
    header: bool = Field(False, description="tsv: the first row of each file names the columns.")
    sacrebleu: dict[str, str] = Field(default_factory=dict, description="Test split -> sacreBLEU test set "
                                      "(e.g. newstest2014: wmt14), fetched through sacreBLEU.")

    @model_validator(mode="before")
    @classmethod
    def _default_path(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("path") is None:
            kind = raw.get("kind", "multi30k")
            if kind == "multi30k":
                raw = {**raw, "path": MULTI30K_DIR}
            elif kind == "hf" and raw.get("name"):
                raw = {**raw, "path": HUB_WATCH}
        return raw

    @model_validator(mode="after")
    def _check(self) -> "CorpusConfig":
        if self.path is None:
            what = "name (a hub dataset) or path (a local dataset folder)" if self.kind == "hf" else "path"
            raise ValueError(f"data.corpus kind {self.kind!r} needs {what}")
        if self.kind != "hf" and (self.name or self.config or self.revision):
            raise ValueError(f"data.corpus name/config/revision apply to kind hf only, not {self.kind!r}")
        if self.kind != "tsv" and (self.columns is not None or self.header):
            raise ValueError(f"data.corpus columns/header apply to kind tsv only, not {self.kind!r}")
        if self.columns is not None and len(set(self.columns)) != len(self.columns):
            raise ValueError(f"data.corpus.columns repeat a name: {list(self.columns)}")
        return self


class DataConfig(_Strict):
    """Corpus selection, validation and train-side hygiene (``corpus`` and ``prepare`` stages)."""

    corpus: CorpusConfig = CorpusConfig()
    src_lang: str = Field("en", description="Source language code (file suffix, column or JSON key).")
    tgt_lang: str = Field("de", description="Target language code (file suffix, column or JSON key).")
    train_split: str = "train"
    valid_split: str = "val"
    test_splits: tuple[str, ...] = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
    min_words: int = Field(1, ge=1, description="Train filter: drop pairs with a side shorter than this (whitespace words).")
    max_words: int = Field(80, ge=1, description="Train filter: drop pairs with a side longer than this (whitespace words).")
    max_ratio: float = Field(3.0, ge=1.0, description="Train filter: drop pairs whose word-length ratio exceeds this.")
    max_train_pairs: int | None = Field(None, ge=1, description="Keep only the first N train pairs (smoke runs).")
    max_eval_pairs: int | None = Field(None, ge=1, description="Keep only the first N pairs of val/test splits (smoke runs).")
    dedup: bool | None = Field(None, description="Train: drop exact duplicate pairs after the first. None: on for "
                               "every corpus but multi30k, whose published train split (3 duplicate En-De pairs) "
                               "is kept whole, as papers train on it.")
    decontaminate: bool = Field(True, description="Train: drop pairs whose source sentence is also a source of a "
                                                  "test split (test contamination).")
    langid: bool = Field(False, description="Train: drop pairs whose source or target is not identified as src_lang / "
                                            "tgt_lang by py3langid (its model ships in the package; off by default: "
                                            "short captions are often misidentified).")

    @property
    def dedup_on(self) -> bool:
        """Whether duplicate pairs are dropped (``dedup``, or its per-corpus default)."""
        return self.dedup if self.dedup is not None else self.corpus.kind != "multi30k"

    @property
    def pair(self) -> str:
        """``"{src_lang}-{tgt_lang}"``, e.g. ``"en-de"``."""
        return f"{self.src_lang}-{self.tgt_lang}"

    @property
    def splits(self) -> tuple[str, ...]:
        """Every split the pipeline reads: train, valid, then the test splits (repeats removed)."""
        return tuple(dict.fromkeys((self.train_split, self.valid_split, *self.test_splits)))


def corpus_identity(data: DataConfig) -> dict[str, Any]:
    """What names the corpus, from the params alone: kind, pair, name or path, config, revision and the
    sacreBLEU test sets (the ``corpus`` stage's ``SOURCE.json`` adds the resolved hub revision)."""
    c = data.corpus
    out: dict[str, Any] = {"kind": c.kind, "pair": data.pair}
    if c.kind == "hf" and c.name:
        out |= {"name": c.name, "config": c.config, "revision": c.revision}
    else:
        out |= {"path": c.path}
    if c.sacrebleu:
        out["sacrebleu"] = dict(sorted(c.sacrebleu.items()))
    return out


def registered_model_name(data: DataConfig, override: str | None = None) -> str:
    """The MLflow registered model of a run: ``override`` if given (``AIAYN_REGISTERED_MODEL``), else
    ``aiayn-{src_lang}-{tgt_lang}``. One registered model per language pair, so a champion alias (and the
    BLEU comparison that moves it) never crosses pairs. Raises ``ConfigError`` for an empty override."""
    if override is not None:
        if not override.strip():
            raise ConfigError("the registered model name override is empty")
        return override
    return f"aiayn-{data.src_lang}-{data.tgt_lang}"


class TokenizerConfig(_Strict):
    """Joint sentencepiece model over both sides of train (``tokenize`` stage)."""

    model_type: Literal["bpe", "unigram"] = "bpe"
    vocab_size: int = Field(8000, ge=64, description="Shared source/target vocabulary size (pieces).")
    character_coverage: float = Field(1.0, gt=0.0, le=1.0)
    input_sentence_size: int = Field(0, description="Sentences sentencepiece trains on, sampled from the train "
                                     "text (seeded: same text, same model); 0 = every sentence (Multi30k). WMT: "
                                     "10M sentences of the 9M+ in 4.5M pairs is all; 2M keeps memory bounded. sentencepiece wants 0 or > 100.")

    @model_validator(mode="after")
    def _check(self) -> "TokenizerConfig":
        if not (self.input_sentence_size == 0 or self.input_sentence_size > 100):
            raise ValueError(f"tokenize.input_sentence_size must be 0 (every sentence) or > 100 (sentencepiece), "
                             f"got {self.input_sentence_size}")
        return self


class ModelConfig(_Strict):
    """Encoder-decoder Transformer hyperparameters (paper Section 3, Table 3).

    ``head_dim`` is derived: ``d_model // n_heads``. ``n_kv_heads`` < ``n_heads``
    gives grouped-query attention (``1`` = multi-query); ``None`` = ``n_heads``.
    """

    vocab_size: int = Field(8000, ge=8, description="Shared vocabulary size; set from the tokenizer at train time.")
    d_model: int = Field(512, ge=8)
    n_heads: int = Field(8, ge=1)
    n_kv_heads: int | None = Field(None, ge=1)
    d_ff: int = Field(2048, ge=8)
    n_layers: int = Field(6, ge=1, description="Layers in the encoder and in the decoder each.")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="P_drop of paper Section 5.4 (residual + embeddings).")
    attention_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    max_positions: int = Field(1024, ge=8, description="Rows of the position table (tokens): the longest source and the "
                               "longest target of an encoder-decoder; decoder_only splits it (max_side_tokens).")
    norm: Literal["post", "pre"] = Field("post", description="post = paper (LayerNorm after residual add); pre = pre-norm variant.")
    activation: Literal["relu", "gelu", "swiglu"] = "relu"
    share_embeddings: bool = Field(True, description="Tie source, target and output embeddings (paper Section 3.4).")
    positions: Literal["sinusoidal", "learned", "rope", "alibi"] = Field(
        "sinusoidal", description="sinusoidal = paper Sec. 3.5; learned = a trained table (Gehring et al. 2017); "
        "rope = rotary self-attention (Su et al. 2021); alibi = distance bias (Press et al. 2022). aiayn.model.positions")
    norm_type: Literal["layernorm", "rmsnorm"] = Field(
        "layernorm", description="layernorm = paper (Ba et al. 2016); rmsnorm = Zhang & Sennrich 2019.")
    arch: Literal["encoder_decoder", "decoder_only"] = Field(
        "encoder_decoder", description="encoder_decoder = paper Sec. 3; decoder_only = one causal stack of 2 * n_layers "
        "self-attention layers over [source, EOS, BOS, target] (Liu et al. 2018), loss on the target only; source and "
        "target share max_positions (each side gets half). aiayn.model.transformer")
    attention_backend: AttentionBackend = "auto"

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        kv = self.n_kv_heads or self.n_heads
        if self.n_heads % kv:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={kv}")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def max_side_tokens(self) -> int:
        """Longest source, and longest target, in tokens: ``max_positions``; half of it for
        ``decoder_only``, whose one stream holds source and target in one position range."""
        return self.max_positions // 2 if self.arch == "decoder_only" else self.max_positions


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # Paper Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 -> 65M params.
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1),
    # Paper Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 -> 213M params.
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3),
    # CPU default for Multi30k (29k pairs): 3+3 layers, d_model 256, head_dim 64,
    # d_ff 512. A deliberate, recorded deviation from base: Multi30k is ~150x
    # smaller than WMT14 and the main job must finish on 2 CPU cores in 45 min
    # (d_ff 512 trains ~1.28x faster than 1024 there: 1024 ran at 0.78x the tokens/s and
    # scored lower in the job's time; docs/studies/job-sizing.md, "Other shapes at the job's time").
    "tiny": dict(d_model=256, n_heads=4, d_ff=512, n_layers=3, dropout=0.1),
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """Return preset ``name`` ('tiny', 'base', 'big') with field overrides applied.

    Raises ``ConfigError`` for an unknown preset or field.
    """
    if name not in MODEL_PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {sorted(MODEL_PRESETS)}")
    try:
        return ModelConfig(**{**MODEL_PRESETS[name], **overrides})
    except ValidationError as e:
        raise ConfigError(f"model preset {name!r} with overrides {overrides}: {e}") from e


class ValidBleuConfig(_Strict):
    """Validation BLEU during training: at every validation, decode (a fixed sample of) the validation split
    and score it with sacreBLEU next to the validation loss (``aiayn.train.validation``).

    Decoding runs in eval mode without touching any RNG (dropout is reseeded per batch), so the trained
    weights are bitwise the same with it on or off; it costs decode time only (measure it with
    ``benchmarks/perf/valid_bleu_cost.py``).
    """

    enabled: bool = Field(True, description="Decode and score the validation split at every validation.")
    sentences: int | None = Field(None, ge=1, description="Size of a fixed, seeded sample of the validation split "
                                  "(None: the whole split; each validation then decodes all of it, which costs "
                                  "decode time only; benchmarks/perf/valid_bleu_cost.py measures it).")
    seed: int = Field(0, description="Seed of the sample (numpy PCG64; the sample never changes within a run).")
    beam_size: int = Field(1, ge=1, description="1: greedy (the cheap default); > 1: beam search with evaluate's "
                           "len_penalty and length_norm.")


class EarlyStopConfig(_Strict):
    """Early stopping on a validation metric (fairseq's ``--patience``): stop after ``patience`` validations in a
    row whose ``metric`` did not beat the best by more than ``min_delta``. Off while ``metric`` is None."""

    metric: Literal["valid_bleu", "valid_chrf", "valid_loss"] | None = Field(
        None, description="None: off. valid_bleu/valid_chrf need valid_bleu.enabled.")
    patience: int = Field(10, ge=1, description="Validations without improvement before stopping.")
    min_delta: float = Field(0.0, ge=0.0, description="Smallest change that counts as an improvement (metric units).")


class SelectConfig(_Strict):
    """Which weights become the model (``aiayn.train.select``), and the validation that checks the choice.

    ``method``: ``last`` (the final step), ``average_last`` (the last ``train.average_last`` scheduled
    checkpoints, never one inside the warmup: paper Section 6.1), ``best`` (the checkpoint with the best
    validation ``metric``), ``average_best`` (the ``train.average_last`` best ones). Every checkpoint
    left on disk is then scored on the validation split with ``metric``; when one of them beats the
    chosen weights, ``guard`` decides: ``keep_better`` takes it (and says so), ``warn`` only says so.
    """

    method: Literal["last", "average_last", "best", "average_best"] = "average_last"
    metric: Literal["valid_loss", "valid_bleu"] = Field(
        "valid_loss", description="How checkpoints and the choice are compared (valid_bleu: the valid_bleu sample).")
    guard: Literal["keep_better", "warn"] = Field(
        "keep_better", description="When a single checkpoint beats the chosen average on validation: keep it, or warn.")


class TrainConfig(_Strict):
    """Optimisation, budget, seeds and checkpointing (``train`` stage).

    Learning rate (paper Section 5.3, eq. 3), scaled by ``lr_scale``:
    ``lr = lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``.
    """

    seed: int = Field(1, description="Initialisation and dropout RNG seed.")
    data_seed: int = Field(1, description="Batch-order seed; order is a pure function of (data_seed, epoch).")
    max_steps: int = Field(100_000, ge=0, description="Optimizer updates budget.")
    max_epochs: int | None = Field(None, ge=1)
    max_time_s: float | None = Field(None, gt=0, description="Wall-clock budget in seconds for the training loop.")
    max_tokens: int = Field(4096, ge=16, description="Tokens (source or target, the larger) per batch before padding.")
    grad_accum: int = Field(1, ge=1, description="Batches per optimizer update, over ALL ranks together (world-size "
                                                 "invariant: divisible by nproc_per_node; each rank takes grad_accum / "
                                                 "world_size of them).")
    lr_scale: float = Field(1.0, gt=0)
    warmup_steps: int = Field(4000, ge=1)
    lr_decay: Literal["inverse_sqrt", "linear"] = Field(
        "inverse_sqrt", description="After warmup: inverse_sqrt (paper eq. 3) or linear (to 0 after max_steps, "
                                    "aiayn.train.schedule.learning_rate; a short budget ends annealed).")
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0, description="epsilon_ls, paper Section 5.4.")
    optimizer: Literal["adam", "muon"] = Field(
        "adam", description="adam: the paper's (Section 5.3). muon: Muon for the layers' weight matrices, lr matched to "
                            "AdamW's update RMS, Adam for the rest (aiayn.train.optim).")
    muon_momentum: float = Field(0.95, gt=0.0, lt=1.0, description="Muon's (Nesterov) momentum.")
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float | None = Field(1.0, gt=0, description="Max global grad L2 norm; null disables.")
    validate_every: int = Field(1000, ge=1, description="Steps between validation-loss evaluations.")
    checkpoint_every: int = Field(1000, ge=1, description="Steps between checkpoints.")
    keep_checkpoints: int = Field(5, ge=1, description="Step checkpoints kept on disk (oldest removed).")
    average_last: int = Field(5, ge=1, description="Average the last K checkpoints into the final model.")
    log_every: int = Field(50, ge=1)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when available, else CPU.")
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads on CPU (None: torch default).")
    distributed: Literal["none", "ddp", "fsdp"] = Field(
        "none", description="ddp: torch DistributedDataParallel over nproc_per_node processes (torchrun; NCCL on CUDA, "
                            "gloo on CPU); fsdp: FSDP2 fully_shard per layer (parameters, gradients and Adam state "
                            "sharded: for big). Either computes the update of one process with the same grad_accum.")
    nproc_per_node: int = Field(1, ge=1, description="Processes (ranks) on this machine; > 1 needs distributed: ddp. "
                                                     "The train stage launches torchrun itself.")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="Autocast dtype of the forward pass; the loss and softmax statistics stay fp32. fp16 adds "
                            "a dynamic loss scaler and needs CUDA; bf16 runs on CUDA (and, slowly, on CPU).")
    compile: bool = Field(False, description="torch.compile the model for training (dynamic shapes). On a 2-core CPU "
                                             "it is 0.87x eager plus ~1 min of compilation (docs/results.md"
                                             "#what-the-steps-parts-and-settings-cost).")
    loss_chunk_tokens: int | None = Field(
        512, ge=1, description="Target tokens per chunk of the fused output projection + loss "
                               "(aiayn.train.linear_label_smoothed_cross_entropy: the batch's (B, T, V) logits never "
                               "exist whole; 1.04x the main job's step on a 2-core CPU, within the spread: its gain is memory at "
                               "large vocabularies, docs/studies/job-sizing.md). Used when "
                               "precision is fp32 and distributed is not fsdp; null: the plain logits path.")
    max_skipped_updates: int = Field(
        10, ge=0, description="Updates with a non-finite gradient are skipped, counted and logged (a loss-spike guard); "
                              "more than this many in a row raise FloatingPointError.")
    epoch_checkpoints: bool = Field(
        False, description="Also validate and checkpoint at the end of every epoch (fairseq's per-epoch checkpoints); "
                           "average_last then counts those checkpoints, whatever their steps.")
    valid_bleu: ValidBleuConfig = ValidBleuConfig()
    early_stop: EarlyStopConfig = EarlyStopConfig()
    select: SelectConfig = SelectConfig()
    init_from: str | None = Field(None, description="Continue training from a parent (None: from scratch): "
                                  "models:/NAME@ALIAS, models:/NAME/VERSION or a model folder; its weights, "
                                  "sentencepiece model and architecture are kept (aiayn.config.finetune).")
    finetune: FinetuneConfig = FinetuneConfig()

    @model_validator(mode="after")
    def _check_world(self) -> "TrainConfig":
        if self.nproc_per_node > 1 and self.distributed == "none":
            raise ValueError(f"train.nproc_per_node={self.nproc_per_node} needs train.distributed: ddp or fsdp")
        needs_bleu = self.early_stop.metric in ("valid_bleu", "valid_chrf") or self.select.metric == "valid_bleu"
        if needs_bleu and not self.valid_bleu.enabled:
            raise ValueError("train.early_stop.metric / train.select.metric on validation BLEU need "
                             "train.valid_bleu.enabled: true")
        warmup = self.finetune.warmup_steps if self.init_from else self.warmup_steps
        if self.lr_decay == "linear" and self.max_steps <= warmup:
            raise ValueError(f"train.lr_decay=linear decays to 0 at max_steps: max_steps ({self.max_steps}) must exceed "
                             f"{'finetune.' if self.init_from else ''}warmup_steps ({warmup})")
        if self.init_from is not None and is_registry_uri(self.init_from):
            registry_parts(self.init_from)  # raises naming the forms
        if self.init_from is not None and not self.init_from.strip():
            raise ValueError("train.init_from is empty: null (from scratch), models:/NAME@ALIAS or a model folder")
        if self.finetune.replay_share > 0 and not self.init_from:
            raise ValueError("train.finetune.replay_share needs train.init_from (replay mixes in the parent's pairs)")
        if self.grad_accum % self.nproc_per_node:
            raise ValueError(f"train.grad_accum={self.grad_accum} must be a multiple of train.nproc_per_node="
                             f"{self.nproc_per_node}: an update is grad_accum batches over all ranks together")
        if self.optimizer == "muon" and (self.distributed == "fsdp" or self.precision == "fp16"):
            raise ValueError("train.optimizer=muon orthogonalises whole weight matrices, in fp32: it needs "
                             "train.distributed none or ddp and train.precision fp32 or bf16")
        return self


class EvalConfig(_Strict):
    """Decoding and scoring (``evaluate`` stage). Defaults: paper Section 6.1."""

    beam_size: int = Field(4, ge=1)
    len_penalty: float = Field(0.6, ge=0.0, description="alpha of the length penalty (length_norm says which).")
    length_norm: Literal["gnmt", "fairseq"] = Field(
        "gnmt", description="Beam score = log P / lp: gnmt lp = ((5+|Y|)/6)**alpha (Wu et al. 2016, the paper's); "
                            "fairseq lp = |Y|**alpha (fairseq's --lenpen; 1.0 = mean log-probability per token).")
    max_len_a: float = Field(1.0, ge=0.0, description="Max output length = max_len_a * src_len + max_len_b (tokens).")
    max_len_b: int = Field(50, ge=1)
    max_tokens: int = Field(4000, ge=16, description="Source tokens per decoding batch.")
    long_policy: Literal["error", "truncate", "split"] = Field(
        "error", description="A test line longer than the model accepts: error (default: a benchmark never changes "
                             "silently), truncate, or split (aiayn.inference.translator).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Decoding device; auto: CUDA when available, else CPU.")
    bleu_tokenize: str = Field("auto", description="sacreBLEU tokenizer of BLEU: auto (by target language: 13a; zh; "
                               "ja-mecab, ko-mecab where installed; flores200 for scripts without spaces) or a "
                               "sacreBLEU name. Recorded in the signature. aiayn.evaluation.scoring.bleu_tokenizer")
    moses_bleu: bool = Field(False, description="Also score fairseq/Wu et al. 2021's way (aiayn.evaluation.moses_bleu): BLEU of "
                             "lowercased, Moses-normalised and -tokenized text, tokenize=none (bleu_moses_lc_tok).")


QUANT_VARIANTS = (
    "ct2-float32", "ct2-int8", "ct2-int16",  # CPU (CTranslate2)
    "ct2-int8_float16", "ct2-bfloat16", "torchao-int8-weight-only", "torchao-int4-weight-only",  # CUDA only
)  # fmt: skip


class QuantizeConfig(_Strict):
    """Quantized variants, their evaluation and the quality gate (``quantize`` stage).

    Every variant is decoded with the ``evaluate`` block's settings on ``data.test_splits`` and
    compared with the eager float model in the same run. CUDA-only variants are recorded as
    ``skipped`` (with the reason) on a machine without CUDA.
    """

    variants: tuple[str, ...] = Field(QUANT_VARIANTS, description=f"Variants to build, from {QUANT_VARIANTS}.")
    max_bleu_drop: float = Field(0.5, ge=0.0, description="Gate: a variant losing more BLEU than this on gate_split is rejected.")
    gate_split: str = Field("test_2016_flickr", description="Test split the gate (and parity) is measured on.")
    serving_preference: tuple[str, ...] = Field(("ct2-int8", "ct2-int16", "ct2-float32"),
                                                description="First accepted variant here becomes the serving default.")
    parity_min_agreement: float = Field(0.99, ge=0.0, le=1.0, description="ct2-float32 greedy lines equal to eager greedy, at least.")
    score_check_sentences: int = Field(64, ge=1, description="Valid-split pairs for the teacher-forced CTranslate2-vs-eager score check.")
    score_tolerance: float = Field(1e-3, gt=0.0, description="Max per-token |log-prob| difference, ct2-float32 vs eager.")
    calibration_sentences: int = Field(256, ge=1, description="Train pairs whose activations feed the outlier report.")
    outlier_factor: float = Field(6.0, gt=0.0, description="Outlier channel: max |activation| > factor x the layer's median.")
    layer_attribution: bool = Field(True, description="Measure the BLEU loss of int8 weights one layer type at a time.")
    attribution_sentences: int = Field(500, ge=1, description="gate_split sentences used by the layer attribution.")
    throughput: bool = Field(True, description="Measure decode throughput (beam, batch 1 and 32, each thread count).")
    throughput_batch1_sentences: int = Field(50, ge=1)
    throughput_batch32_sentences: int = Field(200, ge=1)
    throughput_threads: tuple[int, ...] = (1, 2)
    num_threads: int | None = Field(None, ge=1, description="Threads for the evaluation decodes (None: torch's default).")

    @model_validator(mode="after")
    def _check(self) -> "QuantizeConfig":
        unknown = [v for v in (*self.variants, *self.serving_preference) if v not in QUANT_VARIANTS]
        if unknown:
            raise ValueError(f"unknown quantize variant(s) {unknown}; choose from {list(QUANT_VARIANTS)}")
        return self


#: Evidently embedding-drift methods (``evidently.legacy.metrics.data_drift.embedding_drift_methods``).
EMBEDDING_DRIFT_METHODS = ("mmd", "model", "distance", "ratio")


class MonitorConfig(_Strict):
    """Drift monitor (``monitoring/``): production inputs against the training source side.

    The ``monitor_reference`` stage describes every training source sentence (descriptors in
    ``monitoring.descriptors``) and embeds it with the trained encoder (mean over source
    positions, reduced by a PCA fitted on the reference). A check describes a window of inputs
    the same way and runs Evidently against the reference: one pinned statistical test per
    descriptor (Evidently's own default switches test with the reference size) plus an embedding
    drift method. Verdict: ``drift`` when at least ``drift_share`` of the descriptors drifted or
    the embeddings drifted; ``insufficient_data`` (never a drift verdict either way) below
    ``min_window`` sentences. Units: sentences.
    """

    reference_sentences: int | None = Field(None, ge=100, description="Training source sentences in the reference "
                                            "(None: the whole train split); a seeded sample otherwise.")
    reference_seed: int = Field(0, description="Seed of the reference sample and of the embedding-drift sampling.")
    descriptors: tuple[str, ...] | None = Field(None, description="Descriptors tested (None: all of monitoring.descriptors).")
    stattest: str = Field("ks", description="Evidently per-column test for every descriptor (pinned).")
    stattest_threshold: float = Field(0.01, gt=0.0, description="The test's threshold (a p-value for ks: drift when p < it).")
    thresholds: dict[str, float] = Field(default_factory=dict, description="Per-descriptor threshold overrides.")
    drift_share: float = Field(0.25, gt=0.0, le=1.0, description="Drift when at least this share of descriptors drifted.")
    embedding_dims: int = Field(32, ge=1, description="PCA components of the encoder embedding, fitted on the reference.")
    embedding_method: Literal["mmd", "model", "distance", "ratio"] | None = Field(
        "mmd", description="Evidently embedding-drift method (None: descriptors only).")
    embedding_bootstrap: bool = Field(False, description="Evidently's bootstrap test instead of a fixed threshold: "
                                      "drift when the statistic exceeds its embedding_quantile on reference-vs-reference "
                                      "resamples. Off by default: measured on Multi30k val, it flagged 4 of 20 same-domain "
                                      "windows at 0.95 (its null resamples the reference with replacement).")
    embedding_quantile: float = Field(0.95, gt=0.0, lt=1.0, description="Quantile of the bootstrap (embedding_bootstrap only).")
    embedding_threshold: float | None = Field(0.035, gt=0.0, description="Fixed threshold of the embedding statistic "
                                              "(None: Evidently's default for the method, 0.015 for MMD). 0.035 for MMD "
                                              "on the 32-dim PCA: tuned on Multi30k val (same-domain windows <= 0.013 "
                                              "at 30 sentences; German, French, upper-cased, noised >= 0.097).")
    embedding_sample: int = Field(2000, ge=100, description="Rows per side given to the embedding test (seeded "
                                  "samples; MMD is quadratic in rows).")
    window_size: int = Field(200, ge=1, description="The latest window: the last N sentences of the serving log.")
    min_window: int = Field(30, ge=2, description="Below this many sentences the verdict is insufficient_data.")
    log_path: str = Field("serving/requests.db", description="The serving request log (aiayn serve --log-path).")
    output_false_flag_rate: float = Field(0.02, gt=0.0, lt=0.5, description="Output check: each output signal's "
                                          "threshold leaves at most this share of the served model's answers to the "
                                          "validation split flagged (monitoring.output_check).")
    output_alpha: float = Field(0.01, gt=0.0, lt=1.0, description="Output check: a window alarms when a signal's "
                                "flagged share is above its calibrated rate at this level (binomial test, "
                                "Bonferroni over the signals).")

    @model_validator(mode="after")
    def _check(self) -> "MonitorConfig":
        if self.min_window > self.window_size:
            raise ValueError(f"monitor.min_window ({self.min_window}) > monitor.window_size ({self.window_size})")
        if self.embedding_bootstrap and self.embedding_method == "ratio":
            raise ValueError("monitor.embedding_method 'ratio' has no bootstrap test: set embedding_bootstrap: false")
        bad = {k: v for k, v in self.thresholds.items() if not v > 0}
        if bad:
            raise ValueError(f"monitor.thresholds must be > 0, got {bad}")
        return self


#: What the export stage can write: ``bundle`` (the serving bundle, ``aiayn.export.bundle``; always) and
#: ``hf-marian`` (the Hugging Face Marian folder, ``aiayn.export.hf_marian``, in ``artifacts/export/hf-marian``).
EXPORT_FORMATS = ("bundle", "hf-marian")


class ExportConfig(_Strict):
    """Formats of the ``export`` stage. The default writes the serving bundle only."""

    formats: tuple[Literal["bundle", "hf-marian"], ...] = Field(
        ("bundle",), description="bundle (always: the registry and the service load it); hf-marian adds the Hugging "
                                 "Face Marian folder (transformers, ct2-transformers-converter, mlflow.transformers).")
    mlflow_transformers: bool = Field(
        False, description="Also log the hf-marian folder with MLflow's transformers flavor and register it as "
                           "<registered model>-hf (same alias as the bundle's version); needs hf-marian in formats.")

    @model_validator(mode="after")
    def _check(self) -> "ExportConfig":
        if "bundle" not in self.formats:
            raise ValueError(f"export.formats={list(self.formats)} must include 'bundle' (the serving bundle is "
                             "what the registry and the service load)")
        if self.mlflow_transformers and "hf-marian" not in self.formats:
            raise ValueError("export.mlflow_transformers: true needs 'hf-marian' in export.formats")
        return self


class Params(_Strict):
    """The whole of ``params.yaml``, resolved."""

    data: DataConfig = DataConfig()
    tokenize: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = model_preset("tiny")
    model_preset: str = "tiny"
    train: TrainConfig = TrainConfig()
    evaluate: EvalConfig = EvalConfig()
    quantize: QuantizeConfig = QuantizeConfig()
    monitor: MonitorConfig = MonitorConfig()
    export: ExportConfig = ExportConfig()
    adapt: AdaptConfig = AdaptConfig()

    def to_flat_dict(self) -> dict[str, Any]:
        """``{"train.seed": 1, ...}``: the resolved config, flattened for tracking."""
        out: dict[str, Any] = {}
        for section, value in self.model_dump(mode="json").items():
            if isinstance(value, dict):
                for k, v in value.items():
                    out[f"{section}.{k}"] = v
            else:
                out[section] = value
        return out


def params_from_dict(raw: dict[str, Any]) -> Params:
    """Build ``Params`` from the ``params.yaml`` mapping (``model.preset`` + overrides)."""
    raw = dict(raw or {})
    known = {"data", "tokenize", "model", "train", "evaluate", "quantize", "monitor", "export", "adapt"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"unknown params.yaml section(s) {sorted(unknown)}; expected {sorted(known)}")
    model_raw = dict(raw.pop("model", None) or {})
    preset = model_raw.pop("preset", "tiny")
    try:
        return Params(
            model=model_preset(preset, **model_raw),
            model_preset=preset,
            **{k: v or {} for k, v in raw.items()},
        )
    except ValidationError as e:
        raise ConfigError(f"invalid params: {e}") from e


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml``. Raises ``ConfigError`` (file missing, bad YAML, bad value)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(f"params file not found: {path}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    return params_from_dict(raw or {})
