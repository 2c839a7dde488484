"""Text cases shared by the translation tests."""

#: Every in-line break character that ``str.splitlines`` splits on but a translation line must keep.
BREAKERS = ["\u2028", "\u2029", "\u0085", "\x0c", "\x0b", "\r", "\x1c", "\x1d", "\x1e"]
