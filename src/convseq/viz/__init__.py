"""Figures: matplotlib's object API on the Agg canvas (no pyplot, no window), from plain data.

The lowest layer but errors: other layers hand it numbers and paths, it imports none of them.
"""
