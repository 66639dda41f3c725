"""convseq's Hydra sweeper: hydra-optuna-sweeper's search, continued where it stopped."""
