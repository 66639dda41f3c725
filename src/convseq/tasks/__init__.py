"""The top layer: one module per ``task=`` value, each with a ``run_<task>(cfg)`` over plain config.

`dispatch` chooses the module, `schema` types the Hydra config, `hydra_callbacks` hooks into
multiruns. Nothing else in convseq imports from here.
"""
