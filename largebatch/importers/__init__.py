"""Importers: a largebatch config written from another framework's files, one
sub-package per framework (``colossalai``: ``largebatch config import colossalai``).

Only the command line imports them; a run, and a config load, never do.
"""
