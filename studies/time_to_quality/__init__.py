"""Time to quality on Multi30k: which settings reach a test BLEU soonest on 2 CPU cores."""
