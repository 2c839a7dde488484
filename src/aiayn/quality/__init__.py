"""Output quality: per-sentence signals of what the model answered (``signals``)."""
