"""The phone inventories and the merge map."""

import pytest

from cbasr.corpora.synth.phones import (
    FULL_PHONES,
    MERGE_MAP,
    MERGED_PHONES,
    UnknownPhoneError,
    is_pause,
    merge_phones,
    strip_stress,
)


def test_inventory_sizes():
    assert len(FULL_PHONES) == len(set(FULL_PHONES)) == 69
    assert len(MERGED_PHONES) == len(set(MERGED_PHONES)) == 49


def test_merge_map_is_total_and_onto():
    assert set(MERGE_MAP) == set(FULL_PHONES)
    assert set(MERGE_MAP.values()) == set(MERGED_PHONES)
    for label in MERGED_PHONES:
        assert MERGE_MAP[label] == label


@pytest.mark.parametrize(
    "variant, phone",
    [("a#", "@"), ("3", "@"), ("@2", "@"), ("I2", "I"), ("t#", "t"), ("t2", "t"), ("t[", "t"),
     ("r-", "r"), ("aI2", "aI"), ("IR", "3:"), ("w#", "w")],
)  # fmt: skip
def test_accent_variants_merge(variant, phone):
    assert MERGE_MAP[variant] == phone


def test_stress_and_pauses():
    assert (
        strip_stress("'aU") == "aU" and strip_stress(",oU") == "oU" and strip_stress("t#") == "t#"
    )
    assert all(is_pause(label) for label in ("_", "_:", "_!", "_|", "||"))
    assert not any(is_pause(label) for label in FULL_PHONES)


def test_unknown_label_fails_loudly():
    assert merge_phones(["D", "@2", "k"]) == ["D", "@", "k"]
    with pytest.raises(UnknownPhoneError, match=r"'x'.*spk001-00002"):
        merge_phones(["D", "x"], "spk001-00002")
