"""``aiayn serve``: the HTTP app, its config, request schemas, the micro-batcher, the request log and
the model source (a bundle folder or a registry alias, polled)."""
