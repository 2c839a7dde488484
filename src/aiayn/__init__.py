"""aiayn: reproducible Attention Is All You Need translation pipeline."""

__version__ = "0.1.0"
