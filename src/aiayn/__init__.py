"""aiayn: reproducible Attention Is All You Need translation pipeline.

Importing ``aiayn`` changes nothing in the process: the defaults a process of the pipeline sets
(``OMP_WAIT_POLICY``, ``ATEN_CPU_CAPABILITY``) are set where it starts (``aiayn.config.settings.apply_process_defaults``).
"""

__version__ = "0.1.0"
