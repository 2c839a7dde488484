"""The project's benchmarks, studies and reproducibility checks (index: ``benchmarks/README.md``).

An importable package (``pyproject.toml`` lists ``benchmarks*``), so every script imports what it shares by its
full name (``from benchmarks.harness import ...``) wherever it is started from, with no ``sys.path`` edits:

- ``perf/``     speed and memory: training, decoding, serving, orchestration, the data layer;
- ``studies/``  BLEU and behaviour studies behind the recipe's choices (``docs/studies/``);
- ``repro/``    does a change or a host keep the bytes;
- ``gpu/``      what needs a CUDA GPU (``gpu/run_gpu.sh`` runs it);
- ``harness``   the host line, alternating rounds with median and spread, Markdown tables;
- ``train_steps`` the bare training step the training benchmarks time; ``local_service`` an ``aiayn serve``
  process on a free port;
- ``tests_support`` ``tests/support`` (study logic the tests check) under a name the scripts can import.
"""
