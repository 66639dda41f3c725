"""The lexicon of the synthetic language pair behind `data=toy` (its grammar: `grammar.py`).

The source words are a fixed English-like list; each target stem is made from syllables by a
seeded generator, and the target's morphology (case, number, person, tense) is a fixed set of
suffixes on those stems, so the same seed always gives the same lexicon.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

# -- source lexicon (fixed) ---------------------------------------------------------------------
# "sg:pl" where the plural is irregular, otherwise the plural takes -s / -es / -ies.
_NOUNS = """
dog cat horse bird cow goat pig rabbit fox wolf:wolves bear lion tiger duck frog snake monkey owl
eagle shark teacher student doctor farmer baker king queen soldier sailor child:children
woman:women man:men boy girl friend neighbor driver singer painter writer nurse pilot judge
thief:thieves book letter table chair door window house car boat train bike apple bread cake cup
glass bottle box ball hat coat shoe key knife:knives plate spoon lamp clock phone map picture song
story flower tree stone river lake hill road bridge garden park city village market school church
shop field forest beach island gift ring candle basket blanket rope wheel egg shirt pencil bed wall
tower castle
""".split()
_ADJECTIVES = """
big small old young red blue green black white happy sad tall short heavy quiet loud new cold warm
dark clean dirty rich poor strong weak kind angry brave clever lazy hungry tired famous strange
beautiful soft round empty
""".split()
# "base:past" where the past is irregular, otherwise the past takes -ed / -d / -ied.
_TRANSITIVE = """
see:saw watch find:found like love help follow carry take:took bring:brought buy:bought sell:sold
paint build:built open close kick hold:held push pull call visit meet:met know:knew want need
keep:kept lose:lost hide:hid catch:caught throw:threw draw:drew wash fix chase feed:fed teach:taught
""".split()
_INTRANSITIVE = """
sleep:slept run:ran walk swim:swam sing:sang dance laugh cry jump wait smile work play fall:fell
sit:sat
""".split()
_ADVERBS = """
often always sometimes usually rarely quickly slowly quietly happily suddenly also still already
really carefully
""".split()
_PREPOSITIONS = "in on under near behind with without from to for".split()
_CONJUNCTIONS = "and but because while when".split()
# Determiners: (singular form or "", plural form or ""); "" = no such number.
_DETERMINERS = (
    ("the", "the"),
    ("a", ""),
    ("this", "these"),
    ("every", ""),
    ("", "some"),
    ("", "two"),
    ("", "three"),
    ("", "many"),
)
# Pronouns: (subject, object, agreement class); classes: 0=1sg 1=2sg 2=3sg 3=plural.
_PRONOUNS = (
    ("i", "me", 0),
    ("you", "you", 1),
    ("he", "him", 2),
    ("she", "her", 2),
    ("we", "us", 3),
    ("they", "them", 3),
)

# -- target morphology (fixed suffixes on generated stems) --------------------------------------
SG, PL = 0, 1
NOM, ACC = 0, 1
# Noun endings [gender][number][case]; agreeing words (determiners, adjectives, the relative
# pronoun) take [gender][number].
_NOUN_END = ((("a", "an"), ("i", "in")), (("o", "om"), ("e", "em")))
_AGREE_END = (("a", "i"), ("o", "e"))
# Verb endings [tense][agreement class]: tense 0 = present, 1 = past.
_VERB_END = (("u", "es", "et", "en"), ("avu", "aves", "avet", "aven"))

_ONSETS = "b d f g h k l m n p r s t v z".split()
_VOWELS = "a e i o u".split()
_CODAS = "k l m n r s t".split()


def _plural(noun: str) -> str:
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _third_singular(verb: str) -> str:
    if verb.endswith(("s", "x", "ch", "sh", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _past(verb: str) -> str:
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


def _split(entry: str, regular) -> tuple[str, str]:
    head, _, irregular = entry.partition(":")
    return head, irregular or regular(head)


@dataclass(frozen=True)
class Noun:
    sg: str
    pl: str
    gender: int
    forms: tuple[tuple[str, str], tuple[str, str]]  # [number][case]


@dataclass(frozen=True)
class Agreeing:
    """A word that takes the gender and number of a noun (adjective, determiner, relative)."""

    sg: str  # source form with a singular noun ("" = none)
    pl: str  # source form with a plural noun ("" = none)
    forms: tuple[tuple[str, str], tuple[str, str]]  # [gender][number]


@dataclass(frozen=True)
class Verb:
    base: str
    third: str  # present, 3rd person singular
    past: str
    transitive: bool
    forms: tuple[tuple[str, ...], tuple[str, ...]]  # [tense][agreement class]


@dataclass(frozen=True)
class Lexicon:
    """Both vocabularies of one seed; target stems are drawn from syllables with that seed."""

    nouns: tuple[Noun, ...]
    adjectives: tuple[Agreeing, ...]
    determiners: tuple[Agreeing, ...]
    relative: Agreeing  # source "that"
    transitive: tuple[Verb, ...]
    intransitive: tuple[Verb, ...]
    pronouns: tuple[tuple[str, str, int, str, str], ...]  # src subj, src obj, class, tgt subj, obj
    adverbs: tuple[tuple[str, str], ...]
    prepositions: tuple[tuple[str, str], ...]
    conjunctions: tuple[tuple[str, str], ...]
    negation: tuple[str, str]  # ("not", target particle)


class _StemMaker:
    """Draws pseudo-word stems whose every inflected form is new to the target vocabulary."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()  # membership only: never iterated, so order cannot leak

    def take(self, syllables: tuple[int, ...], coda: bool, endings: tuple[str, ...]) -> str:
        rng = self.rng
        for _ in range(10_000):
            n = rng.choice(syllables)
            stem = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n))
            if coda:
                stem += rng.choice(_CODAS)
            forms = [stem + e for e in endings]
            if len(set(forms)) == len(forms) and not any(f in self.used for f in forms):
                self.used.update(forms)
                return stem
        raise RuntimeError("toy lexicon: ran out of pseudo-word stems")


def _flat(table) -> tuple[str, ...]:
    return tuple(e for row in table for e in (_flat(row) if isinstance(row, tuple) else (row,)))


def source_words() -> list[str]:
    """Every source word form the grammar can produce."""
    words = ["that", "not", "does", "do", "did"]
    for entry in _NOUNS:
        words += _split(entry, _plural)
    for entry in _TRANSITIVE + _INTRANSITIVE:
        base, past = _split(entry, _past)
        words += [base, _third_singular(base), past]
    words += _ADJECTIVES + _ADVERBS + _PREPOSITIONS + _CONJUNCTIONS
    words += [w for pair in _DETERMINERS for w in pair if w]
    words += [w for subj, obj, _ in _PRONOUNS for w in (subj, obj)]
    return words


@lru_cache(maxsize=8)
def build_lexicon(seed: int = 1) -> Lexicon:
    """The lexicon of `seed`: fixed source words, target stems and noun genders drawn from it."""
    rng = random.Random(f"convseq-toy-lexicon:{seed}")  # str seeds hash with sha512: stable
    maker = _StemMaker(rng)
    maker.used.update(source_words())  # no target word may look like a source word
    agree_ends = _flat(_AGREE_END)

    def agreeing(sg: str, pl: str, syllables: tuple[int, ...]) -> Agreeing:
        stem = maker.take(syllables, True, agree_ends)
        return Agreeing(sg, pl, tuple(tuple(stem + e for e in row) for row in _AGREE_END))

    def word(syllables: tuple[int, ...]) -> str:
        return maker.take(syllables, False, ("",))

    # Function words first (short stems), then content words.
    determiners = tuple(agreeing(sg, pl, (1,)) for sg, pl in _DETERMINERS)
    relative = agreeing("that", "that", (1,))
    pronouns = []
    for subj, obj, cls in _PRONOUNS:
        stem = maker.take((1,), False, ("", "m"))
        pronouns.append((subj, obj, cls, stem, stem + "m"))
    prepositions = tuple((p, word((1, 2))) for p in _PREPOSITIONS)
    conjunctions = tuple((c, word((1, 2))) for c in _CONJUNCTIONS)
    negation = ("not", word((1,)))
    adverbs = tuple((a, word((2, 3))) for a in _ADVERBS)

    nouns = []
    for entry in _NOUNS:
        sg, pl = _split(entry, _plural)
        gender = rng.randrange(2)
        stem = maker.take((1, 2), True, _flat(_NOUN_END[gender]))
        forms = tuple(tuple(stem + e for e in by_case) for by_case in _NOUN_END[gender])
        nouns.append(Noun(sg, pl, gender, forms))
    adjectives = tuple(agreeing(a, a, (1, 2)) for a in _ADJECTIVES)

    def verbs(entries: list[str], transitive: bool) -> tuple[Verb, ...]:
        out = []
        for entry in entries:
            base, past = _split(entry, _past)
            stem = maker.take((1, 2), True, _flat(_VERB_END))
            forms = tuple(tuple(stem + e for e in row) for row in _VERB_END)
            out.append(Verb(base, _third_singular(base), past, transitive, forms))
        return tuple(out)

    return Lexicon(
        nouns=tuple(nouns),
        adjectives=adjectives,
        determiners=determiners,
        relative=relative,
        transitive=verbs(_TRANSITIVE, True),
        intransitive=verbs(_INTRANSITIVE, False),
        pronouns=tuple(pronouns),
        adverbs=adverbs,
        prepositions=prepositions,
        conjunctions=conjunctions,
        negation=negation,
    )
