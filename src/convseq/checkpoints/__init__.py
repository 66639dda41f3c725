"""Checkpoint files: atomic writing, weights-only reading, resume resolution, averaging, and
reading and writing fairseq's translation checkpoints (fconv and LightConv / DynamicConv).

Builds on models and data (a fairseq checkpoint becomes its family's model and two dictionaries).
"""
