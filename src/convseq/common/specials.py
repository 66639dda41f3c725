"""fairseq's special symbols and their ids, the first four entries of every dictionary.

`convseq.data.dictionary.Dictionary` numbers them so; the collater pads and appends EOS with these
ids, and the searches, which never see a dictionary, forbid pad and penalise unk by them.
"""

from __future__ import annotations

BOS, PAD, EOS, UNK = "<s>", "<pad>", "</s>", "<unk>"
SPECIAL_SYMBOLS = (BOS, PAD, EOS, UNK)
BOS_ID, PAD_ID, EOS_ID, UNK_ID = range(len(SPECIAL_SYMBOLS))
