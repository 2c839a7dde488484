"""The data layer: where parallel text comes from, how it is read, and what of it training keeps.

A corpus source (``params.data.corpus``) becomes a checksummed snapshot of its raw text (the
``corpus`` stage), which ``prepare`` reads back as a stream of pairs and cleans with counted rules.
Nothing here holds a whole corpus in memory, and the libraries for outside sources (Hugging Face
``datasets``, sacreBLEU's test sets) are imported only when a config asks for them.
"""
