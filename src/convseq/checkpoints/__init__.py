"""Checkpoint files: atomic writing, weights-only reading, resume resolution, averaging, and
reading and writing fairseq's fconv checkpoints.

Builds on models and data (a fairseq checkpoint becomes an `FConvModel` and two dictionaries).
"""
