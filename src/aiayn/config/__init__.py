"""Configuration: the typed ``params.yaml`` schema and presets (``schema``), the cross-field checks of
``aiayn check`` (``checks``) and the ``AIAYN_*`` environment (``settings``)."""
