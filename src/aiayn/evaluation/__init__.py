"""Scores: corpus BLEU/chrF with sacreBLEU signatures (``scoring``) and the Moses-convention BLEU of
Wu et al. 2021 as a labelled second metric (``moses_bleu``)."""
