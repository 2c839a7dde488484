"""Quantized variants of the trained model: CTranslate2 int8/int16 on CPU, torchao on GPU.

One concept per module:

- ``converter``      our bundle -> CTranslate2 ``TransformerSpec`` (post- and pre-norm), refusals
- ``variants``       the variant registry, availability (CUDA), builders, metadata
- ``fake_quant``     CTranslate2's per-row int8 scheme in PyTorch (per-layer-type attribution)
- ``outliers``       per-channel activation statistics and the outlier report
- ``checks``         the quality gate and degenerate-output checks
- ``throughput``     side-by-side decode timing

Decoding a converted model under our rules (length cap, GNMT re-ranking) and the eager reference
decode are ``aiayn.decoders``' ``CT2Decoder`` and ``EagerDecoder``, shared with serving. Only
``variants.build_torchao`` imports torchao, and only when CUDA is present.
"""
