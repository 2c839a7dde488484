"""Quantized variants of the trained model: CTranslate2 int8/int16 on CPU, torchao on GPU.

One concept per module (each module's docstring says which): converting our model to CTranslate2,
the variant registry and builders, CTranslate2's int8 arithmetic reproduced in PyTorch (and which
int8 arithmetic this host runs), activation outliers, the quality gate, decode timing. The quantize
stage (``aiayn.stages.quantize``) puts them together: every variant is built, decoded like the float
model, scored and gated.

Decoding a converted model under our rules (length cap, GNMT re-ranking) is ``aiayn.inference.runtimes``'
``CT2Decoder``, shared with serving. torchao is imported only when a CUDA variant is built.
"""
