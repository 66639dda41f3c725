"""Training: the LightningModule, its loss and metrics, the callbacks, the run log, the profiler.

Builds on inference (validation BLEU translates with a `Translator`), evaluation (scores and
history readers), checkpoints, data, models and optim; never on tasks.
"""
