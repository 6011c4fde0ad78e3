"""Sentence generator for the synthetic corpus: a small English grammar over fixed word lists.

Sentences are lower-case words separated by single spaces, 3 to 15 words long, drawn from a
few templates (statements with transitive or intransitive verbs, copulas, questions,
imperatives, "there are" sentences and clauses joined by a conjunction) over a vocabulary of
several hundred words. Generation is deterministic given the seed of the ``random.Random``
that drives it.

Every word is an ordinary English word that eSpeak NG pronounces from its English
dictionary (no abbreviations, digits or foreign names, which would make eSpeak spell
letters or switch language).
"""

import random
from dataclasses import dataclass

__all__ = ["MAX_WORDS", "MIN_WORDS", "Sentence", "SentenceGenerator", "vocabulary"]

MIN_WORDS = 3
MAX_WORDS = 15

# Nouns: singular, with irregular plurals listed in _IRREGULAR_PLURALS.
_NOUNS = """
    dog cat horse bird fish cow sheep goat mouse rabbit fox wolf bear duck frog snake
    man woman child boy girl baby teacher doctor farmer driver singer painter student
    sailor soldier baker nurse king queen friend neighbour brother sister mother father
    house garden river lake forest mountain island village city street road bridge
    school church market station office kitchen window door wall roof table chair bed
    box bag basket bottle glass cup plate spoon knife book letter paper pencil picture
    clock phone lamp candle key coat hat shoe shirt ring apple orange lemon potato
    carrot bread cake cheese egg sandwich flower tree leaf stone rock cloud storm
    car bus train boat ship plane bicycle wheel engine machine computer radio camera
    song story game lesson question answer problem idea plan dream secret message
    ball drum guitar piano ticket map coin gift towel blanket ladder hammer rope
    television treasure garage
""".split()

_IRREGULAR_PLURALS = {
    "man": "men",
    "woman": "women",
    "child": "children",
    "mouse": "mice",
    "sheep": "sheep",
    "fish": "fish",
    "wolf": "wolves",
    "leaf": "leaves",
    "knife": "knives",
    "potato": "potatoes",
    "baby": "babies",
    "city": "cities",
    "story": "stories",
}

_ADJECTIVES = """
    big small large little tall short long old young new red green blue yellow black
    white brown grey pink purple happy sad angry quiet loud bright dark warm cold hot
    cool soft hard heavy light fast slow clean dirty empty full rich poor strong weak
    busy lazy brave clever gentle kind friendly strange funny famous careful hungry
    tired sleepy lucky lovely pretty ugly simple useful wooden broken golden shiny
    usual unusual
""".split()

# Verbs taking an object: (base, third person singular, past).
_TRANSITIVE_VERBS = [
    ("see", "sees", "saw"),
    ("find", "finds", "found"),
    ("take", "takes", "took"),
    ("bring", "brings", "brought"),
    ("carry", "carries", "carried"),
    ("open", "opens", "opened"),
    ("close", "closes", "closed"),
    ("paint", "paints", "painted"),
    ("clean", "cleans", "cleaned"),
    ("wash", "washes", "washed"),
    ("buy", "buys", "bought"),
    ("sell", "sells", "sold"),
    ("build", "builds", "built"),
    ("break", "breaks", "broke"),
    ("fix", "fixes", "fixed"),
    ("watch", "watches", "watched"),
    ("follow", "follows", "followed"),
    ("push", "pushes", "pushed"),
    ("pull", "pulls", "pulled"),
    ("hold", "holds", "held"),
    ("throw", "throws", "threw"),
    ("catch", "catches", "caught"),
    ("drop", "drops", "dropped"),
    ("keep", "keeps", "kept"),
    ("leave", "leaves", "left"),
    ("meet", "meets", "met"),
    ("need", "needs", "needed"),
    ("want", "wants", "wanted"),
    ("like", "likes", "liked"),
    ("love", "loves", "loved"),
    ("hate", "hates", "hated"),
    ("help", "helps", "helped"),
    ("call", "calls", "called"),
    ("visit", "visits", "visited"),
    ("draw", "draws", "drew"),
    ("cook", "cooks", "cooked"),
    ("eat", "eats", "ate"),
    ("make", "makes", "made"),
    ("move", "moves", "moved"),
    ("hide", "hides", "hid"),
    ("lose", "loses", "lost"),
    ("send", "sends", "sent"),
    ("show", "shows", "showed"),
    ("touch", "touches", "touched"),
    ("check", "checks", "checked"),
    ("borrow", "borrows", "borrowed"),
    ("choose", "chooses", "chose"),
    ("remember", "remembers", "remembered"),
]

# Verbs without an object: (base, third person singular, past).
_INTRANSITIVE_VERBS = [
    ("sleep", "sleeps", "slept"),
    ("run", "runs", "ran"),
    ("walk", "walks", "walked"),
    ("sing", "sings", "sang"),
    ("dance", "dances", "danced"),
    ("laugh", "laughs", "laughed"),
    ("smile", "smiles", "smiled"),
    ("wait", "waits", "waited"),
    ("work", "works", "worked"),
    ("play", "plays", "played"),
    ("swim", "swims", "swam"),
    ("jump", "jumps", "jumped"),
    ("sit", "sits", "sat"),
    ("stand", "stands", "stood"),
    ("fall", "falls", "fell"),
    ("arrive", "arrives", "arrived"),
    ("travel", "travels", "travelled"),
    ("rest", "rests", "rested"),
    ("shout", "shouts", "shouted"),
    ("listen", "listens", "listened"),
    ("climb", "climbs", "climbed"),
    ("stay", "stays", "stayed"),
    ("cry", "cries", "cried"),
    ("fly", "flies", "flew"),
]

_ADVERBS = """
    quickly slowly quietly loudly carefully happily sadly early late often never always
    sometimes again together alone outside inside today yesterday tomorrow here there
""".split()

_PREPOSITIONS = """
    in on under near behind beside above below into across along through over inside
    outside around towards from with without
""".split()

_TIME_PHRASES = [
    "in the morning",
    "in the evening",
    "at night",
    "every day",
    "last week",
    "next year",
    "on monday",
    "on tuesday",
    "on wednesday",
    "on thursday",
    "on friday",
    "on saturday",
    "on sunday",
    "in january",
    "in april",
    "in june",
    "in september",
    "in december",
    "after lunch",
    "before dinner",
    "at noon",
    "in the summer",
    "in the winter",
]

_NAMES = """
    peter mary john alice david sarah james emma thomas lucy robert anna michael helen
    daniel laura george kate william susan
""".split()

_NUMBERS = """
    two three four five six seven eight nine ten eleven twelve fifteen twenty thirty
    forty fifty sixty
""".split()

_DETERMINERS_SINGULAR = [
    "the",
    "a",
    "this",
    "that",
    "every",
    "my",
    "your",
    "his",
    "her",
    "our",
    "their",
]
_DETERMINERS_PLURAL = ["the", "these", "those", "some", "many", "few", "my", "your", "our", "their"]
_PRONOUNS = [
    ("i", False),
    ("you", True),
    ("he", False),
    ("she", False),
    ("we", True),
    ("they", True),
]
_CONJUNCTIONS = ["and", "but", "because", "while", "so", "although", "when", "before", "after"]
_INTENSIFIERS = ["very", "quite", "rather", "really", "too"]
_QUESTION_WORDS = ["where", "when", "why", "how"]
_MODALS = ["can", "could", "will", "would", "should", "must", "might"]
_OPENERS = ["i think that", "she said that", "we know that", "they told me that", "it seems that"]


@dataclass(frozen=True)
class Sentence:
    """A generated sentence: ``words`` (lower case, single spaces) and ``question`` (ends in '?')."""

    words: str
    question: bool

    @property
    def text(self) -> str:
        """The sentence as given to the synthesizer, with its final punctuation."""
        return self.words + ("?" if self.question else ".")


def _plural(noun: str) -> str:
    if noun in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[noun]
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def _article(determiner: str, next_word: str) -> str:
    """``a`` becomes ``an`` before a vowel sound ("an apple", "a useful box")."""
    if determiner == "a" and next_word[0] in "aeiou" and not next_word.startswith(("use", "usu")):
        return "an"
    return determiner


def vocabulary() -> frozenset[str]:
    """Every word form the generator can produce."""
    words = set(_NOUNS) | {_plural(n) for n in _NOUNS} | set(_ADJECTIVES) | set(_ADVERBS)
    words |= {form for verb in _TRANSITIVE_VERBS + _INTRANSITIVE_VERBS for form in verb}
    for group in (
        _PREPOSITIONS,
        _NAMES,
        _NUMBERS,
        _DETERMINERS_SINGULAR,
        _DETERMINERS_PLURAL,
        _CONJUNCTIONS,
        _INTENSIFIERS,
        _QUESTION_WORDS,
        _MODALS,
        _TIME_PHRASES,
        _OPENERS,
    ):
        words |= {w for phrase in group for w in phrase.split()}
    words |= {p for p, _ in _PRONOUNS}
    words |= {"an", "is", "are", "was", "were", "there", "please", "do", "does", "did", "not"}
    return frozenset(words)


class SentenceGenerator:
    """Draws sentences of ``MIN_WORDS`` to ``MAX_WORDS`` words; deterministic given ``seed``."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def sentence(self) -> Sentence:
        """The next sentence; templates that come out too long or too short are redrawn."""
        templates = (
            self._transitive,
            self._intransitive,
            self._copula,
            self._there_are,
            self._question,
            self._imperative,
            self._compound,
            self._reported,
        )
        weights = (5, 4, 2, 1, 2, 1, 2, 1)
        while True:
            template = self._rng.choices(templates, weights)[0]
            words, question = template()
            if MIN_WORDS <= len(words) <= MAX_WORDS:
                return Sentence(" ".join(words), question)

    def _maybe(self, probability: float) -> bool:
        return self._rng.random() < probability

    def _noun_phrase(self) -> tuple[list[str], bool]:
        """A noun phrase and whether it is plural."""
        rng = self._rng
        kind = rng.random()
        if kind < 0.12:
            return [rng.choice(_NAMES)], False
        plural = self._maybe(0.35)
        noun = rng.choice(_NOUNS)
        head = [rng.choice(_ADJECTIVES)] if self._maybe(0.45) else []
        if plural:
            head.append(_plural(noun))
            determiner = (
                rng.choice(_NUMBERS) if self._maybe(0.25) else rng.choice(_DETERMINERS_PLURAL)
            )
        else:
            head.append(noun)
            determiner = _article(rng.choice(_DETERMINERS_SINGULAR), head[0])
        return [determiner] + head, plural

    def _subject(self) -> tuple[list[str], bool]:
        if self._maybe(0.25):
            pronoun, plural = self._rng.choice(_PRONOUNS)
            return [pronoun], plural
        return self._noun_phrase()

    def _verb(
        self, verbs: list[tuple[str, str, str]], plural: bool, subject: list[str]
    ) -> list[str]:
        base, third, past = self._rng.choice(verbs)
        if self._maybe(0.5):
            return [past]
        if self._maybe(0.2):
            return [self._rng.choice(_MODALS), base]
        singular_third = not plural and subject != ["i"]
        return [third if singular_third else base]

    def _modifiers(self) -> list[str]:
        words: list[str] = []
        if self._maybe(0.3):
            words.append(self._rng.choice(_ADVERBS))
        if self._maybe(0.4):
            words += [self._rng.choice(_PREPOSITIONS)] + self._noun_phrase()[0]
        if self._maybe(0.2):
            words += self._rng.choice(_TIME_PHRASES).split()
        return words

    def _clause(self) -> list[str]:
        subject, plural = self._subject()
        if self._maybe(0.55):
            return subject + self._verb(_TRANSITIVE_VERBS, plural, subject) + self._noun_phrase()[0]
        return subject + self._verb(_INTRANSITIVE_VERBS, plural, subject)

    def _transitive(self) -> tuple[list[str], bool]:
        subject, plural = self._subject()
        verb = self._verb(_TRANSITIVE_VERBS, plural, subject)
        return subject + verb + self._noun_phrase()[0] + self._modifiers(), False

    def _intransitive(self) -> tuple[list[str], bool]:
        subject, plural = self._subject()
        return subject + self._verb(_INTRANSITIVE_VERBS, plural, subject) + self._modifiers(), False

    def _copula(self) -> tuple[list[str], bool]:
        subject, plural = self._noun_phrase()
        verb = self._rng.choice(["are", "were"] if plural else ["is", "was"])
        if self._maybe(0.3):
            verb += " not"
        intensifier = [self._rng.choice(_INTENSIFIERS)] if self._maybe(0.4) else []
        return subject + verb.split() + intensifier + [self._rng.choice(_ADJECTIVES)], False

    def _there_are(self) -> tuple[list[str], bool]:
        rng = self._rng
        head = [rng.choice(_NUMBERS)] + ([rng.choice(_ADJECTIVES)] if self._maybe(0.5) else [])
        place = [rng.choice(_PREPOSITIONS)] + self._noun_phrase()[0]
        return ["there", rng.choice(["are", "were"])] + head + [
            _plural(rng.choice(_NOUNS))
        ] + place, False

    def _question(self) -> tuple[list[str], bool]:
        rng = self._rng
        subject, plural = self._subject()
        base = rng.choice(_TRANSITIVE_VERBS)[0]
        auxiliary = rng.choice(
            ["did", "do" if plural or subject in (["i"], ["you"]) else "does"] + _MODALS
        )
        opener = [rng.choice(_QUESTION_WORDS)] if self._maybe(0.6) else []
        return opener + [auxiliary] + subject + [base] + self._noun_phrase()[0], True

    def _imperative(self) -> tuple[list[str], bool]:
        rng = self._rng
        please = ["please"] if self._maybe(0.4) else []
        verb = rng.choice(_TRANSITIVE_VERBS)[0]
        return please + [verb] + self._noun_phrase()[0] + self._modifiers(), False

    def _compound(self) -> tuple[list[str], bool]:
        return self._clause() + [self._rng.choice(_CONJUNCTIONS)] + self._clause(), False

    def _reported(self) -> tuple[list[str], bool]:
        return self._rng.choice(_OPENERS).split() + self._clause(), False
