"""The data layer: corpus sources, streaming readers of parallel text and the train-side hygiene rules.

``sources`` turns ``params.data.corpus`` into a checksummed snapshot of the raw text (the ``corpus``
stage's ``artifacts/corpus``) and reads a split of it back as a stream of pairs; ``readers`` holds
the line, Moses, TSV and JSONL readers with their error messages; ``hub`` talks to Hugging Face
``datasets`` and sacreBLEU (imported only when a corpus needs them); ``hygiene`` decides, pair by
pair, what ``prepare`` keeps, and counts every drop.
"""
