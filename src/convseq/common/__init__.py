"""What every layer may share: plain configs, the special-token ids, this process's rank."""
