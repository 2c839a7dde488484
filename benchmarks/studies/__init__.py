"""The studies behind the recipe's choices (BLEU, decoding, drift thresholds); their write-ups: ``docs/studies/``."""
