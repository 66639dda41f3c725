"""Evaluation: sacreBLEU/chrF, tokenized BLEU, the paired bootstrap, run histories and sweep
reports.

Reads text and run folders; draws through viz; imports no model, training or inference code.
"""
