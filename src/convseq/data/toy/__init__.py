"""The embedded toy language pair (`data=toy`): its lexicon, its grammar and the corpus files."""
