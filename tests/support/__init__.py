"""What the tests (and some benchmarks) use but the installed package must not ship: tiny trained
models, the scratch project, real-service harnesses, a headless browser, drift inputs, test doubles.

The test modules import it as ``support`` (pytest puts ``tests/`` on ``sys.path``); a benchmark puts
``tests/`` on ``sys.path`` first.
"""
