"""The synth corpus phone inventories: eSpeak NG English mnemonics and a merged set.

eSpeak reports each phoneme by its mnemonic, with a stress mark in front of stressed vowels
(``'`` primary, ``,`` secondary) and pause phonemes (``_``, ``_:``, ``_!``, ``_|``) between
clauses. The corpus strips the stress marks and drops the pauses, which leaves the 69
labels of ``FULL_PHONES`` over the eight English voices and the generator's vocabulary
(measured on every vocabulary word and thousands of sentences, at 130 and 200 words per
minute). Several labels are accent variants of one phone, so ``MERGE_MAP`` folds them into
the 49 labels of ``MERGED_PHONES``:

=========  ======  =====================================================================
full       merged  why
=========  ======  =====================================================================
@2         @       weak "the" before a consonant (en-us, en-gb-x-rp, en-029)
@-         @       schwa before a linking r ("camera")
a#         @       unstressed "a" ("again"); en-gb-x-rp and en-029 also use it for
                   final "-er", where the other voices give ``3``
3          @       unstressed "-er": a schwa in the British voices, r-coloured in en-us
I2, I#     I       unstressed and central variants of I ("before", "boxes")
i          i:      final "-y" ("happy"); en-gb-scotland turns unstressed I into i
IR, VR     3:      en-gb-scotland's rhotic NURSE vowels ("bird", "church")
O2         0       en-us CLOTH vowel ("long", "often") where British voices give 0
aI2        aI      en-gb-scotland's PRICE vowel before voiceless consonants
aI3        aI@     en-us "tired", where the other voices give aI@
i@3        i@      NEAR vowel at the end of a word ("here")
o@         O@      FORCE vowel ("door"); en-gb-x-gbcwmd already replaces it by O@
;          j       the glide eSpeak inserts between i and a vowel ("piano", "radio")
r-         r       linking r before a vowel
t#         t       en-us flapped t ("city")
t2         t       en-us t before a weak vowel ("into")
t[         t       en-029 dental t, replacing T ("think")
w#         w       en-gb-scotland voiceless "wh" ("where")
=========  ======  =====================================================================

Every other label maps to itself. A label outside ``FULL_PHONES`` is an error
(:class:`UnknownPhoneError`), never silently passed on: a new eSpeak release or a new
word must extend the table above.
"""

__all__ = [
    "FULL_PHONES",
    "MERGED_PHONES",
    "MERGE_MAP",
    "UnknownPhoneError",
    "is_pause",
    "merge_phones",
    "strip_stress",
]

_STRESS_MARKS = "',%="

_VARIANTS = {
    "@2": "@",
    "@-": "@",
    "a#": "@",
    "3": "@",
    "I2": "I",
    "I#": "I",
    "i": "i:",
    "IR": "3:",
    "VR": "3:",
    "O2": "0",
    "aI2": "aI",
    "aI3": "aI@",
    "i@3": "i@",
    "o@": "O@",
    ";": "j",
    "r-": "r",
    "t#": "t",
    "t2": "t",
    "t[": "t",
    "w#": "w",
}

MERGED_PHONES: tuple[str, ...] = (
    # vowels
    "0", "3:", "@", "@L", "A:", "A@", "E", "I", "O:", "O@", "OI", "U", "U@", "V",
    "a", "aI", "aI@", "aU", "aa", "e@", "eI", "i:", "i@", "oU", "u:",
    # consonants
    "D", "N", "S", "T", "Z", "b", "d", "dZ", "f", "g", "h", "j", "k", "l", "m", "n",
    "p", "r", "s", "t", "tS", "v", "w", "z",
)  # fmt: skip

FULL_PHONES: tuple[str, ...] = tuple(sorted(MERGED_PHONES + tuple(_VARIANTS)))

MERGE_MAP: dict[str, str] = {label: _VARIANTS.get(label, label) for label in FULL_PHONES}


class UnknownPhoneError(ValueError):
    """eSpeak produced a label that is not in ``FULL_PHONES``."""


def strip_stress(label: str) -> str:
    """Drop eSpeak's stress marks from a phoneme mnemonic: ``"'aU"`` -> ``"aU"``."""
    return label.lstrip(_STRESS_MARKS)


def is_pause(label: str) -> bool:
    """Pauses (``_``, ``_:``, ``_!``, ``_|``) and word or clause boundaries (``|``, ``||``)."""
    return label.startswith(("_", "|"))


def merge_phones(phones: list[str], utterance_id: str = "") -> list[str]:
    """Map stress-stripped eSpeak labels to ``MERGED_PHONES``.

    Raises:
        UnknownPhoneError: a label is not in ``FULL_PHONES``; the message names the label
            and ``utterance_id``.
    """
    merged = []
    for label in phones:
        if label not in MERGE_MAP:
            where = f" in utterance {utterance_id}" if utterance_id else ""
            raise UnknownPhoneError(
                f"eSpeak phone {label!r}{where} is not in the synth inventory "
                "(cbasr.corpora.synth.phones); add it to the documented merge map"
            )
        merged.append(MERGE_MAP[label])
    return merged
