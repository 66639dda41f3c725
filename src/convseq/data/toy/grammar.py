"""The synthetic language pair behind `data=toy`: its lexicon and its grammar.

The source side is English-like; the target side is an invented language built from syllables.
Both are made by one small probabilistic grammar, so each target sentence is a function of its
source sentence (no synonyms, no free choices), yet the target differs from a word-by-word gloss:

- word order: subject-object-verb in every clause (source: subject-verb-object), adjectives after
  their noun, a preverbal adverb moves with the verb, the negation particle follows the adverb;
- agreement: determiners, adjectives and the relative pronoun take the noun's gender and number,
  nouns take nominative (subject) or accusative (object, after a preposition) case, verbs take
  the subject's person and number and the tense (from "did", "does" or the verb form itself).

Every target word is aligned to exactly one source word ("does"/"do"/"did" have none), which
the tests use to measure reordering and agreement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from convseq.data.toy.lexicon import ACC, NOM, PL, SG, Lexicon, build_lexicon


@dataclass(frozen=True)
class ToyPair:
    """One sentence pair with its word alignment."""

    src: tuple[str, ...]
    tgt: tuple[str, ...]
    align: tuple[int, ...]  # source position of each target word (-1: none)


class _W:
    """A word of both sides at once: its source form and target form (None: absent there)."""

    __slots__ = ("src", "tgt")

    def __init__(self, src: str | None, tgt: str | None):
        self.src = src
        self.tgt = tgt


# Determiner indices into Lexicon.determiners with their weights, by number.
_DET_SG = ((0, 1, 2, 3), (55, 25, 12, 8))
_DET_PL = ((0, 2, 4, 5, 6, 7), (55, 15, 12, 6, 5, 7))
MAX_LEN = 30
MIN_LEN = 3


class _Sampler:
    """Draws phrases as (source words, target words, agreement class)."""

    def __init__(self, lex: Lexicon, rng: random.Random):
        self.lex = lex
        self.rng = rng

    def pronoun(self, case: int) -> tuple[list[_W], list[_W], int]:
        subj, obj, cls, t_subj, t_obj = self.rng.choice(self.lex.pronouns)
        w = _W(subj, t_subj) if case == NOM else _W(obj, t_obj)
        return [w], [w], cls

    def noun_phrase(self, case: int, rel: float = 0.0, pp: float = 0.0):
        rng, lex = self.rng, self.lex
        number = PL if rng.random() < 0.4 else SG
        idx, weights = _DET_PL if number == PL else _DET_SG
        det = lex.determiners[rng.choices(idx, weights)[0]]
        noun = rng.choice(lex.nouns)
        g = noun.gender
        n_adj = rng.choices((0, 1, 2), (50, 38, 12))[0]
        adjs = rng.sample(lex.adjectives, n_adj)
        w_det = _W(det.pl if number == PL else det.sg, det.forms[g][number])
        w_noun = _W(noun.pl if number == PL else noun.sg, noun.forms[number][case])
        w_adjs = [_W(a.sg, a.forms[g][number]) for a in adjs]
        src = [w_det, *w_adjs, w_noun]  # source: determiner adjectives noun
        tgt = [w_det, w_noun, *w_adjs]  # target: determiner noun adjectives
        cls = 3 if number == PL else 2
        u = rng.random()
        if u < rel:  # subject relative clause, verb-final in the target
            w_rel = _W("that", lex.relative.forms[g][number])
            r_src, r_tgt = self.predicate(cls, pps=False)
            src += [w_rel, *r_src]
            tgt += [w_rel, *r_tgt]
        elif u < rel + pp:
            p_src, p_tgt = self.prep_phrase()
            src += p_src
            tgt += p_tgt
        return src, tgt, cls

    def prep_phrase(self) -> tuple[list[_W], list[_W]]:
        prep, t_prep = self.rng.choice(self.lex.prepositions)
        if self.rng.random() < 0.1:
            src, tgt, _ = self.pronoun(ACC)
        else:
            src, tgt, _ = self.noun_phrase(ACC)
        w = _W(prep, t_prep)
        return [w, *src], [w, *tgt]

    def predicate(self, cls: int, pps: bool) -> tuple[list[_W], list[_W]]:
        """Verb group, object and prepositional phrases of a clause whose subject has `cls`."""
        rng, lex = self.rng, self.lex
        transitive = rng.random() < 0.7
        verb = rng.choice(lex.transitive if transitive else lex.intransitive)
        past = rng.random() < 0.5
        form = verb.forms[int(past)][cls]
        adv = [_W(*rng.choice(lex.adverbs))] if rng.random() < 0.25 else []
        if rng.random() < 0.15:  # do-support: "does not (adv) see" -> "(adv) NEG seet"
            aux = "did" if past else ("does" if cls == 2 else "do")
            w_not = _W("not", lex.negation[1])
            w_verb = _W(verb.base, form)
            v_src = [_W(aux, None), w_not, *adv, w_verb]
            v_tgt = [*adv, w_not, w_verb]
        else:
            surface = verb.past if past else (verb.third if cls == 2 else verb.base)
            w_verb = _W(surface, form)
            v_src = [*adv, w_verb]
            v_tgt = [*adv, w_verb]
        o_src: list[_W] = []
        o_tgt: list[_W] = []
        if transitive:
            if rng.random() < 0.15:
                o_src, o_tgt, _ = self.pronoun(ACC)
            else:
                o_src, o_tgt, _ = self.noun_phrase(ACC)
        p_src: list[_W] = []
        p_tgt: list[_W] = []
        if pps:
            for _ in range(rng.choices((0, 1, 2), (60, 32, 8))[0]):
                s, t = self.prep_phrase()
                p_src += s
                p_tgt += t
        # source: verb object PPs; target: object verb PPs
        return v_src + o_src + p_src, o_tgt + v_tgt + p_tgt

    def clause(self) -> tuple[list[_W], list[_W]]:
        rng = self.rng
        u = rng.random()
        if u < 0.4:
            s_src, s_tgt, cls = self.pronoun(NOM)
        elif u < 0.46:  # coordinated subject: plural agreement
            a_src, a_tgt, _ = self.noun_phrase(NOM)
            b_src, b_tgt, _ = self.noun_phrase(NOM)
            w_and = _W(*self.lex.conjunctions[0])
            s_src, s_tgt, cls = a_src + [w_and] + b_src, a_tgt + [w_and] + b_tgt, 3
        else:
            s_src, s_tgt, cls = self.noun_phrase(NOM, rel=0.15, pp=0.08)
        p_src, p_tgt = self.predicate(cls, pps=True)
        return s_src + p_src, s_tgt + p_tgt

    def sentence(self) -> tuple[list[_W], list[_W]]:
        src, tgt = self.clause()
        if self.rng.random() < 0.33:
            w = _W(*self.rng.choice(self.lex.conjunctions))
            src2, tgt2 = self.clause()
            src, tgt = src + [w] + src2, tgt + [w] + tgt2
        return src, tgt


def generate_pairs(seed: int = 1, n: int | None = None):
    """Yield `n` (all if None: endless) sentence pairs of `seed`, duplicates included.

    Each pair has 3..30 words on both sides; the stream depends on `seed` only.
    """
    lex = build_lexicon(seed)
    sampler = _Sampler(lex, random.Random(f"convseq-toy-corpus:{seed}"))
    made = 0
    while n is None or made < n:
        src_w, tgt_w = sampler.sentence()
        src = [w for w in src_w if w.src is not None]
        tgt = [w for w in tgt_w if w.tgt is not None]
        if not (MIN_LEN <= len(src) <= MAX_LEN and MIN_LEN <= len(tgt) <= MAX_LEN):
            continue
        pos = {id(w): i for i, w in enumerate(src)}  # lookups only
        yield ToyPair(
            src=tuple(w.src for w in src),
            tgt=tuple(w.tgt for w in tgt),
            align=tuple(pos.get(id(w), -1) for w in tgt),
        )
        made += 1
