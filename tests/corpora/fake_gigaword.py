"""Small fake copies of the released Gigaword headline pairs, in both layouts."""

from pathlib import Path

PAIRS = {
    "train": [
        (
            "australia 's current account deficit shrunk by a record #.## billion dollars -lrb- #.## "
            "billion us -rrb- in the june quarter",
            "australian current account deficit narrows sharply",
        ),
        (
            "at least two people were killed in a suspected bomb attack on a passenger bus",
            "at least two dead in bus bomb",
        ),
        ("the dollar rose against the yen on friday", "dollar rises against yen"),
        ("", "an empty article"),
    ],
    "dev": [
        ("oil prices fell sharply on monday after opec agreed to raise output", "oil prices fall"),
        ("the <unk> company said profits rose", "company profits rise"),
    ],
    "test": [
        ("UNK", "UNK"),
        (
            "japan 's prime minister said on tuesday he would not resign",
            "japanese premier will not resign",
        ),
    ],
}


def make_fake_gigaword(root: Path, layout: str = "org_data") -> Path:
    for split, pairs in PAIRS.items():
        sources = "".join(src + "\n" for src, _ in pairs)
        targets = "".join(tgt + "\n" for _, tgt in pairs)
        if layout == "org_data":
            paths = (root / "org_data" / f"{split}.src.txt", root / "org_data" / f"{split}.tgt.txt")
        else:
            paths = {
                "train": ("sumdata/train/train.article.txt", "sumdata/train/train.title.txt"),
                "dev": (
                    "sumdata/train/valid.article.filter.txt",
                    "sumdata/train/valid.title.filter.txt",
                ),
                "test": ("sumdata/Giga/input.txt", "sumdata/Giga/task1_ref0.txt"),
            }[split]
            paths = tuple(root / p for p in paths)
        for path, text in zip(paths, (sources, targets)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root
