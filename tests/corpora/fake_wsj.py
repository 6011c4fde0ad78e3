"""A small fake WSJ copy, shaped like the real one: disc directories or the flat wsj0/wsj1
layout, the real index paths (comments, both entry styles, eval92 without extensions, eval93
naming the wrong disc), ``.dot`` transcripts exercising every normalisation rule, and
Shorten-compressed SPHERE ``.wv1`` audio; and the LM disc's text and ARPA files
(:func:`make_fake_wsj_lm`)."""

from pathlib import Path

import numpy as np

from tests.corpora.compress_writer import compress_bytes
from tests.corpora.shorten_writer import write_wv1

# (index disc, index path, entry style, [(audio disc, path, utt, transcript)])
ENTRIES = [
    (
        "11-13.1",
        "wsj0/doc/indices/train/tr_s_wv1.ndx",
        "wsj0",
        [
            (
                "11-2.1",
                "wsj0/si_tr_s/011",
                "011c0201",
                "The company\\'s I\\. B\\. M\\. unit [<door_slam] <and> "
                "%PERCENT --DASH ,COMMA ~ . [loud_breath]",
            ),
            (
                "11-2.1",
                "wsj0/si_tr_s/011",
                "011c0202",
                "Prices rose [um] point five .POINT percent",
            ),
            ("11-2.1", "wsj0/si_tr_s/401", "401c0201", "Speaker four oh one is left out of si84"),
        ],
    ),
    (
        "13-34.1",
        "wsj1/doc/indices/si_tr_s.ndx",
        "wsj1",
        [
            (
                "13-34.1",
                "wsj1/si_tr_s/46u",
                "46uc030b",
                "[door_slam] ~",
            ),  # empty after normalisation
            ("13-34.1", "wsj1/si_tr_s/4a0", "4a0c0201", "Stocks [noise/] fell [/noise] sharply"),
        ],
    ),
    (
        "13-34.1",
        "wsj1/doc/indices/h1_p0.ndx",
        "wsj1",
        [
            ("13-16.1", "wsj1/si_dt_20/4k0", "4k0c0301", "Analysts expect [cross_talk] more cuts"),
            ("13-16.1", "wsj1/si_dt_20/4k0", "4k0c0302", "The dollar weakened"),
        ],
    ),
    (
        "11-13.1",
        "wsj0/doc/indices/test/nvp/si_et_20.ndx",
        "eval92",
        [
            ("11-14.1", "wsj0/si_et_20/440", "440c0401", "Bonds rallied [unintelligible] late"),
            ("11-14.1", "wsj0/si_et_20/440", "440c0402", "Trading was light"),
        ],
    ),
    (
        "13-32.1",
        "wsj1/doc/indices/wsj1/eval/h1_p0.ndx",
        "eval93",
        [
            ("13-33.1", "wsj1/si_et_h1/wsj64k", "4kbc0401", "Banks lend more"),
        ],
    ),
]
TRUNCATED = "4k0c0302"
NORMALISED = {
    "011c0201": "THE COMPANY'S I. B. M. UNIT AND PERCENT -DASH ,COMMA",
    "011c0202": "PRICES ROSE POINT FIVE POINT PERCENT",
    "4a0c0201": "STOCKS FELL SHARPLY",
    "4k0c0301": "ANALYSTS EXPECT MORE CUTS",
    "440c0401": "BONDS RALLIED LATE",
}


def _entry_line(style: str, disc: str, path: str, utt: str) -> str:
    disc_id = disc.replace("-", "_").replace(".", "_")
    if style == "wsj1":
        return f"{disc_id}: /{path}/{utt}.wv1"
    if style == "eval92":
        return f"{disc_id}:{path}/{utt}"  # no extension
    if style == "eval93":
        return f"13_32_1:{path}/{utt}.wv1"  # the index names the wrong disc
    return f"{disc_id}:{path}/{utt}.wv1"


def make_fake_wsj(root: Path, flat: bool = False, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    place = (lambda disc, rel: root / rel) if flat else (lambda disc, rel: root / disc / rel)
    dots: dict[Path, list[str]] = {}
    for index_disc, index_path, style, utts in ENTRIES:
        lines = [";", "; Fake index: comments start with a semicolon", ";"]
        for disc, folder, utt, text in utts:
            lines.append(_entry_line(style, disc, folder, utt))
            audio_dir = place(disc, folder)
            audio_dir.mkdir(parents=True, exist_ok=True)
            samples = np.concatenate(
                [
                    0.3 * np.sin(2 * np.pi * f * np.arange(2400) / 16000)
                    for f in rng.integers(200, 2000, size=8)
                ]
            )  # 1.2 s
            wav = audio_dir / f"{utt}.wv1"
            write_wv1(wav, samples + 0.002 * rng.standard_normal(samples.size))
            if utt == TRUNCATED:
                wav.write_bytes(wav.read_bytes()[: 1024 + 300])
            dots.setdefault(audio_dir / f"{utt[:6]}00.dot", []).append(f"{text} ({utt})")
        index = place(index_disc, index_path)
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_text("\n".join(lines) + "\n")
    for path, lines in dots.items():
        path.write_text("\n".join(lines) + "\n")
    return root


LM_WORDS = (
    "THE COMPANY SAID STOCKS FELL ROSE PRICES BONDS RALLIED LATE MORE CUTS BANKS LEND".split()
)


def lm_sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` normalised sentences of 3-8 words from :data:`LM_WORDS`."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(LM_WORDS, size=int(rng.integers(3, 9)))) for _ in range(count)]


def arpa_of(sentences: list[str], order: int) -> str:
    """An ARPA text of maximum-likelihood n-grams (back-off weights 0: a fixture, not a
    smoothed model) over ``sentences`` with ``<s>``/``</s>``."""
    counts: list[dict[tuple[str, ...], int]] = [{} for _ in range(order)]
    for sentence in sentences:
        words = ["<s>", *sentence.split(), "</s>"]
        for n in range(1, order + 1):
            for i in range(len(words) - n + 1):
                gram = tuple(words[i : i + n])
                counts[n - 1][gram] = counts[n - 1].get(gram, 0) + 1
    total = sum(c for gram, c in counts[0].items() if gram != ("<s>",))
    lines = ["\\data\\", *(f"ngram {n + 1}={len(counts[n])}" for n in range(order)), ""]
    for n in range(order):
        lines.append(f"\\{n + 1}-grams:")
        for gram, c in sorted(counts[n].items()):
            if n == 0:
                p = -99.0 if gram == ("<s>",) else np.log10(c / total)
            else:
                p = np.log10(c / counts[n - 1][gram[:-1]])
            backoff = " 0.0" if n < order - 1 else ""
            lines.append(f"{p:.4f} {' '.join(gram)}{backoff}")
        lines.append("")
    lines.append("\\end\\")
    return "\n".join(lines) + "\n"


def make_fake_wsj_lm(root: Path, flat: bool = False, per_year: int = 100) -> list[str]:
    """The LM disc's ``lng_modl``: ``lm_train/np_data/{87,88,89}/*.z`` (lower-case sentences
    among markup lines, Unix-compressed) and ``base_lm/{bcb20onp,tcb20onp}.z`` (ARPA bigram
    and trigram of those sentences). Returns the sentences, normalised, in file order."""
    lng_modl = root / ("" if flat else "13-32.1") / "wsj1/doc/lng_modl"
    sentences = lm_sentences(3 * per_year)
    for k, year in enumerate(("87", "88", "89")):
        ours = sentences[k * per_year : (k + 1) * per_year]
        for part in range(2):
            half = ours[part * per_year // 2 : (part + 1) * per_year // 2]
            lines = [f"<art.{year}0{part}>", "<p>"]
            lines += [s.lower() for s in half[: len(half) // 2]] + ["</p>", "<p>"]
            lines += [s.lower() for s in half[len(half) // 2 :]] + ["</p>", "</art>"]
            path = lng_modl / "lm_train" / "np_data" / year / f"w{year}_{part:02d}.z"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(compress_bytes(("\n".join(lines) + "\n").encode("latin-1")))
    (lng_modl / "base_lm").mkdir(parents=True, exist_ok=True)
    for name, order in (("bcb20onp", 2), ("tcb20onp", 3)):
        text = arpa_of(sentences, order).encode("latin-1")
        (lng_modl / "base_lm" / f"{name}.z").write_bytes(compress_bytes(text))
    return sentences
