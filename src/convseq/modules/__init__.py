"""fconv's building blocks: embeddings, TBC and causal convolutions, attention, weight norm."""
