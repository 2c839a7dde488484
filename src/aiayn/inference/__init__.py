"""Translating with a trained model: search, runtimes, text rules, the translator, and ``load()``.

``artifacts`` reads the model folder and the serving bundle; ``load`` builds the bundle's decoder
(``runtimes``: eager over our own ``search``, or CTranslate2) behind the ``translator``'s input rules
(``text``). The service, the MLflow pyfunc model, ``aiayn translate`` and the evaluate stage all
translate through here.
"""
