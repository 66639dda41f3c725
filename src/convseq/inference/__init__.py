"""Inference: the `Translator`, loading models for translation, ensembles, generation over a
data-bin split, translation records and the generation profiler.

Builds on checkpoints, search, models and data; never on training or tasks.
"""
