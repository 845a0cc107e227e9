"""``largebatch config import colossalai`` (``importer``): a largebatch config from a Colossal-AI legacy
config and, optionally, its train script.

Colossal-AI's legacy ViT examples split a run between a config file (``BATCH_SIZE``,
``NUM_EPOCHS``, ``fp16=dict(mode=AMP_TYPE.TORCH)``, ``gradient_accumulation``,
``clip_grad_norm``, ``dali=dict(...)``, ``parallel=dict(...)``) and a train script
(the optimizer, the schedule, the model, the loss). The import reads the config with
``colossalai`` stood in for (``reader``), reads the script without running it
(``script``), maps each setting (``mapping`` and the modules it calls), applies ``--set``
overrides, and writes a config file (``render``) whose header lists every value's
origin, every value filled in, and every setting left unmapped with why. The file is
loaded back through ``resolve_config`` (and the batch arithmetic derived at the world
size) before it is returned, so what is written loads with ``largebatch config show``.

The importer reads ``largebatch.config`` (the schema, the loader, ``resolve_config``); the
config layer never imports it. A Colossal-AI config given where a largebatch config is
expected (``train.py --config``) is only recognised there (``largebatch.config.loader``),
and its error names the import command.
"""
