"""What the tests (and some benchmarks) use but the installed package must not ship: tiny trained
models, the scratch project, real-service harnesses, a headless browser, drift inputs, test doubles, and the
study logic the benchmark scripts run and the tests check (variants_plan, split_coverage, wu2021_text).

The test modules import it as ``support`` (pyproject's pytest ``pythonpath`` holds ``tests/``); the benchmark
scripts as ``benchmarks.tests_support`` (a package whose ``__path__`` is this folder).
"""
