"""``tests/support`` under a name the benchmark scripts can import: ``benchmarks.tests_support.<module>``.

The study logic the tests check lives in ``tests/support`` (it is not shipped with ``aiayn``); the tests import
it as ``support.<module>`` (pytest's ``pythonpath``), the scripts as ``benchmarks.tests_support.<module>``. This
package holds no module of its own: its ``__path__`` is ``tests/support``, so Python's import system finds the
modules there, no ``sys.path`` edit. A module imported this way may import ``aiayn`` and third-party packages, and
its ``tests/support`` neighbours only relatively (``from .scratch import ...``), never as ``support.<module>``.
"""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parents[2] / "tests" / "support")]
