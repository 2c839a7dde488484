"""What leaves the pipeline: the serving bundle and its model card, the CTranslate2 converter and the
Hugging Face Marian format. (The MLflow pyfunc wrapper lives in ``aiayn.tracking.registry``: MLflow
stays inside the tracking package.)"""
