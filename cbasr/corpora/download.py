"""Corpus downloads: resumable, checked against the published checksum, extracted once.

:func:`fetch` downloads ``<url>`` into ``<dir>/<name>`` through ``<name>.part``. An interrupted
download (a killed run, a dropped connection) resumes from the bytes already there with an
HTTP ``Range`` request; a server that ignores it sends the whole file again, which is then
written from the start. The finished file is checked against its published SHA-256 or MD5 (or,
where none is published, its size, or at least a clean gzip stream) before it takes its name; a
file that fails is moved aside to ``<name>.bad`` and the error names it with both sums. A
checked archive leaves a stamp (``.<name>.checked``: size, modification time and sum), so a
rerun does not hash 6 GB again.

:func:`extract_tar` unpacks an archive with :mod:`tarfile`'s ``data`` filter (no absolute
paths, no links out of the folder) and writes ``.<name>.extracted`` last, so an interrupted
extraction is redone and a finished one is skipped.
"""

import gzip
import hashlib
import json
import logging
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from cbasr.progress import byte_bar
from cbasr.storage.files import write_json

__all__ = ["Remote", "DownloadError", "fetch", "extract_tar", "file_digest"]

log = logging.getLogger(__name__)
CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A download that failed or a file that does not match its published checksum."""


@dataclass(frozen=True)
class Remote:
    """A file to download: its URL and what it is checked against (any that are known)."""

    url: str
    sha256: str | None = None
    md5: str | None = None
    size: int | None = None

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def check(self) -> str:
        """What a download of this file is checked against, in words."""
        if self.sha256:
            return "SHA-256"
        if self.md5:
            return "MD5"
        if self.size is not None:
            return "size"
        return "gzip stream" if self.name.endswith(".gz") else "nothing"


def file_digest(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _mismatch(remote: Remote, path: Path) -> str | None:
    """Why ``path`` is not ``remote``'s file, or None when it matches."""
    if remote.sha256:
        found = file_digest(path, "sha256")
        return None if found == remote.sha256 else f"SHA-256 {found}, published {remote.sha256}"
    if remote.md5:
        found = file_digest(path, "md5")
        return None if found == remote.md5 else f"MD5 {found}, published {remote.md5}"
    if remote.size is not None:
        size = path.stat().st_size
        return None if size == remote.size else f"{size} bytes, published {remote.size}"
    if remote.name.endswith(".gz"):  # path may be the .part file
        if path.stat().st_size == 0:
            return "an empty file, not a gzip stream"
        try:
            with gzip.open(path, "rb") as f:
                while f.read(CHUNK):
                    pass
        except (OSError, EOFError, zlib.error) as e:
            return f"not a complete gzip stream ({e})"
    return None


def _stamp(path: Path) -> Path:
    return path.with_name(f".{path.name}.checked")


def _stamp_of(path: Path, remote: Remote) -> dict:
    status = path.stat()
    return {
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
        "check": remote.check(),
        "sum": remote.sha256 or remote.md5 or remote.size,
    }


def _verify(remote: Remote, path: Path, final: Path) -> None:
    """Raise :class:`DownloadError` (the file moved to ``<name>.bad``) unless ``path`` matches."""
    why = _mismatch(remote, path)
    if why is not None:
        bad = final.with_name(final.name + ".bad")
        path.replace(bad)
        raise DownloadError(
            f"{final.name} from {remote.url} is corrupt: {why}; moved to {bad} "
            "(rerun to download it again)"
        )


def _total(response, offset: int) -> int | None:
    """The whole file's size from a response's Content-Range or Content-Length."""
    content_range = response.headers.get("Content-Range", "")
    if "/" in content_range and content_range.rsplit("/", 1)[1].strip().isdigit():
        return int(content_range.rsplit("/", 1)[1])
    length = response.headers.get("Content-Length")
    if length is not None and length.isdigit():
        return int(length) + offset
    return None


def _transfer(remote: Remote, part: Path, timeout: float) -> bool:
    """One request appending to ``part``; True when the file is complete."""
    offset = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(remote.url, headers={"User-Agent": "cbasr"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # nothing after the bytes we have: complete
            return True
        raise DownloadError(f"{remote.url}: HTTP {e.code} {e.reason}") from e
    with response:
        resumed = offset > 0 and getattr(response, "status", None) == 206
        if offset and not resumed:
            log.info("%s: the server sent the whole file; starting again", remote.name)
            offset = 0
        elif resumed:
            log.info("%s: resuming after %d bytes", remote.name, offset)
        total = _total(response, offset)
        written = offset
        with (
            open(part, "ab" if resumed else "wb") as f,
            byte_bar(remote.name, total, offset) as bar,
        ):
            for chunk in iter(lambda: response.read(CHUNK), b""):
                f.write(chunk)
                written += len(chunk)
                bar.update(len(chunk))
    return total is None or written >= total


def fetch(
    remote: Remote,
    directory: str | Path,
    retries: int = 5,
    timeout: float = 60.0,
    backoff: float = 1.0,
) -> Path:
    """``directory/<name>``, downloaded and checked unless a checked copy is there already.

    A dropped connection is retried ``retries`` times, each resuming where the last stopped,
    after ``backoff`` seconds, doubling.

    Raises:
        DownloadError: the URL cannot be fetched (after the retries), or the file does not
            match its published checksum (it is moved to ``<name>.bad``).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / remote.name
    stamp = _stamp(final)
    if final.is_file():
        try:
            if json.loads(stamp.read_text()) == _stamp_of(final, remote):
                return final
        except (OSError, ValueError):
            pass
        log.info("%s: checking the %s of the file already there", final, remote.check())
        _verify(remote, final, final)
        write_json(stamp, _stamp_of(final, remote))
        return final
    part = final.with_name(final.name + ".part")
    log.info("downloading %s -> %s (checked by %s)", remote.url, final, remote.check())
    for attempt in range(retries + 1):
        try:
            if _transfer(remote, part, timeout):
                break
            reason = "the connection closed early"
        except OSError as e:  # URLError included: no connection, a reset, a timeout
            reason = str(getattr(e, "reason", e))
        have = part.stat().st_size if part.exists() else 0
        if attempt == retries:
            raise DownloadError(
                f"{remote.url}: {reason}; {have} bytes kept in {part}, a rerun resumes there"
            )
        log.warning("%s: %s after %d bytes; retrying", remote.name, reason, have)
        time.sleep(min(backoff * 2.0**attempt, 60.0))
    _verify(remote, part, final)
    part.replace(final)
    write_json(stamp, _stamp_of(final, remote))
    return final


def extract_tar(archive: str | Path, into: str | Path) -> bool:
    """Unpack ``archive`` into ``into`` unless its ``.<name>.extracted`` marker is there;
    True when it unpacked."""
    archive, into = Path(archive), Path(into)
    marker = into / f".{archive.name}.extracted"
    if marker.is_file():
        return False
    into.mkdir(parents=True, exist_ok=True)
    log.info("extracting %s -> %s", archive, into)
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, filter="data")
            else:  # Python before 3.10.12: check the members by hand
                for member in tar.getmembers():
                    target = (into / member.name).resolve()
                    if (
                        not target.is_relative_to(into.resolve())
                        or member.issym()
                        or member.islnk()
                    ):
                        raise DownloadError(f"{archive}: unsafe member {member.name!r}")
                tar.extractall(into)
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise DownloadError(f"{archive}: cannot extract ({e}); delete it to download again") from e
    write_json(marker, {"archive": str(archive.resolve()), "size": archive.stat().st_size})
    return True
