"""Token ids of a text input (Gigaword's articles), stored like features for the same pipeline.

A text-to-text corpus has no audio: its "frames" are the source tokens, embedded by the
encoder's token-embedding front end (``subsampling=embed``). :func:`extract_source_tokens`
writes, per split, the ids of each utterance's ``source`` field under a source vocabulary
(id 0 is padding, id 1 ``<unk>`` for tokens outside it)::

    <out>/<split>/ids.bin    int32 ids of every utterance, concatenated
    <out>/<split>/index.tsv  id <TAB> first token <TAB> number of tokens
    <out>/<split>/.done      {"kind": "tokens", "dim": vocabulary size, ...}, written last

:class:`TokenStore` reads them with :class:`~cbasr.data.features.FeatureStore`'s interface
(``num_frames``, ``in``, ``[id]`` -> ``(T,)`` int64); :func:`open_store` picks the store a
split directory holds.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from cbasr.data.features import FeatureStore
from cbasr.data.manifest import read_manifest
from cbasr.data.vocab import tokens_of
from cbasr.storage.files import write_json, write_text

__all__ = [
    "PAD",
    "UNK",
    "SOURCE_VOCAB",
    "source_vocabulary",
    "extract_source_tokens",
    "TokenStore",
    "open_store",
    "experiment_input",
]

PAD, UNK = "<pad>", "<unk>"
SOURCE_VOCAB = "source_vocab.txt"  # in the feature directory (and copied into the experiment)


def source_vocabulary(manifest: str | Path, units: str, size: int = 0) -> list[str]:
    """``[<pad>, <unk>, tokens...]``: the source tokens of a training manifest, most frequent
    first (ties alphabetical), the ``size`` most frequent if ``size > 0``."""
    counts: dict[str, int] = {}
    for record in read_manifest(manifest):
        for token in tokens_of(record, units, field="source"):
            counts[token] = counts.get(token, 0) + 1
    ordered = sorted((t for t in counts if t not in (PAD, UNK)), key=lambda t: (-counts[t], t))
    return [PAD, UNK] + (ordered[: size - 2] if size > 0 else ordered)


def extract_source_tokens(
    manifest: str | Path, out_dir: str | Path, units: str, vocab: list[str]
) -> dict:
    """Write the source ids of every utterance of ``manifest``; skipped if already complete."""
    out_dir = Path(out_dir)
    params = {
        "manifest": str(Path(manifest).resolve()),
        "units": units,
        "vocab_size": len(vocab),
        "vocab_sha1": hashlib.sha1("\n".join(vocab).encode()).hexdigest(),
    }
    done = out_dir / ".done"
    if done.is_file() and json.loads(done.read_text()).get("params") == params:
        return json.loads(done.read_text())
    done.unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = {token: i for i, token in enumerate(vocab)}
    index, chunks, offset, unknown = [], [], 0, 0
    for record in read_manifest(manifest):
        tokens = tokens_of(record, units, field="source")
        row = np.array([ids.get(t, 1) for t in tokens], dtype=np.int32)
        unknown += int((row == 1).sum())
        chunks.append(row)
        index.append(f"{record['id']}\t{offset}\t{len(row)}")
        offset += len(row)
    (out_dir / "ids.bin.tmp").write_bytes(np.concatenate(chunks).tobytes() if chunks else b"")
    (out_dir / "ids.bin.tmp").replace(out_dir / "ids.bin")
    write_text(out_dir / "index.tsv", "".join(line + "\n" for line in index))
    summary = {
        "params": params,
        "kind": "tokens",
        "dim": len(vocab),
        "kept": len(index),
        "skipped": 0,
        "frames": offset,
        "unknown": unknown,
    }
    write_json(done, summary)
    return summary


class TokenStore(FeatureStore):
    """Random access to the source ids of one split written by :func:`extract_source_tokens`."""

    def _open(self, split_dir: Path, total: int) -> np.ndarray:
        return np.memmap(split_dir / "ids.bin", dtype=np.int32, mode="r", shape=(total,))

    def __getitem__(self, utt_id: str) -> torch.Tensor:
        """``(T,)`` int64 source ids of ``utt_id``."""
        offset, length = self.index[utt_id]
        return torch.from_numpy(np.asarray(self._data[offset : offset + length], dtype=np.int64))


def open_store(split_dir: str | Path) -> FeatureStore | TokenStore:
    """The store of a split directory: source tokens or filterbank features."""
    done = Path(split_dir) / ".done"
    if done.is_file() and json.loads(done.read_text()).get("kind") == "tokens":
        return TokenStore(split_dir)
    return FeatureStore(split_dir)


def experiment_input(directory: str | Path) -> tuple[int, tuple[torch.Tensor, torch.Tensor] | None]:
    """``(input_dim, cmvn)`` of a feature or experiment directory: the source vocabulary size and
    None for text input (``source_vocab.txt``), the feature dimension and the normalisation
    statistics for filterbanks (``cmvn.json``)."""
    from cbasr.data.features import load_cmvn

    directory = Path(directory)
    vocab = directory / SOURCE_VOCAB
    if vocab.is_file():
        return len([t for t in vocab.read_text(encoding="utf-8").split("\n") if t]), None
    cmvn = load_cmvn(directory / "cmvn.json")
    return cmvn[0].numel(), cmvn
