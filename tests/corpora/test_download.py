"""Downloads against a local HTTP server: a correct archive, a corrupted one (refused and named),
an interrupted one (resumed), a server that ignores ranges; extraction once and safely; and
cbasr-download fetching and unpacking LibriSpeech archives from a mirror."""

import gzip
import hashlib
import io
import json
import logging
import os
import tarfile

import pytest

from cbasr.cli.download import main as download_main
from cbasr.corpora.download import DownloadError, Remote, extract_tar, fetch
from tests.corpora.fake_librispeech import fake_archive
from tests.corpora.http_mirror import Mirror

DATA = bytes(range(256)) * 4000  # 1 MB: several chunks of the reader


@pytest.fixture
def mirror():
    server = Mirror()
    yield server
    server.close()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_correct_file_is_downloaded_checked_and_not_fetched_again(tmp_path, mirror):
    mirror.files["/12/a.tar.gz"] = DATA
    remote = Remote(f"{mirror.url}/12/a.tar.gz", sha256=sha256(DATA))
    path = fetch(remote, tmp_path)
    assert path == tmp_path / "a.tar.gz" and path.read_bytes() == DATA
    assert not (tmp_path / "a.tar.gz.part").exists()
    assert fetch(remote, tmp_path) == path
    assert len(mirror.requests) == 1  # the checked stamp: no second request, no rehash


def test_a_corrupted_file_is_refused_named_and_moved_aside(tmp_path, mirror):
    mirror.files["/12/a.tar.gz"] = DATA[:-1] + b"x"
    remote = Remote(f"{mirror.url}/12/a.tar.gz", sha256=sha256(DATA))
    with pytest.raises(
        DownloadError, match=rf"a.tar.gz from .* is corrupt: SHA-256 \w+, published {sha256(DATA)}"
    ):
        fetch(remote, tmp_path, backoff=0)
    assert not (tmp_path / "a.tar.gz").exists()
    assert (tmp_path / "a.tar.gz.bad").read_bytes() == DATA[:-1] + b"x"
    mirror.files["/12/a.tar.gz"] = DATA  # the mirror repaired: a rerun downloads it again
    assert fetch(remote, tmp_path).read_bytes() == DATA


def test_md5_size_and_gzip_checks(tmp_path, mirror):
    mirror.files["/31/b.tar.gz"] = DATA
    good = fetch(
        Remote(f"{mirror.url}/31/b.tar.gz", md5=hashlib.md5(DATA).hexdigest()), tmp_path / "m"
    )
    assert good.read_bytes() == DATA
    with pytest.raises(DownloadError, match="corrupt: MD5"):
        fetch(Remote(f"{mirror.url}/31/b.tar.gz", md5="0" * 32), tmp_path / "m2")
    with pytest.raises(DownloadError, match=f"corrupt: {len(DATA)} bytes, published 5"):
        fetch(Remote(f"{mirror.url}/31/b.tar.gz", size=5), tmp_path / "s")
    text = gzip.compress(DATA)
    mirror.files["/11/lm.arpa.gz"] = text[:-100]  # truncated: the gzip stream does not end
    with pytest.raises(DownloadError, match="not a complete gzip stream"):
        fetch(Remote(f"{mirror.url}/11/lm.arpa.gz"), tmp_path / "g")
    mirror.files["/11/lm.arpa.gz"] = text
    assert fetch(Remote(f"{mirror.url}/11/lm.arpa.gz"), tmp_path / "g").read_bytes() == text


def test_a_dropped_connection_is_resumed_from_where_it_stopped(tmp_path, mirror):
    mirror.files["/12/a.tar.gz"] = DATA
    mirror.drop["/12/a.tar.gz"] = 2  # the first two responses stop half-way
    path = fetch(Remote(f"{mirror.url}/12/a.tar.gz", sha256=sha256(DATA)), tmp_path, backoff=0)
    assert path.read_bytes() == DATA
    ranges = [r for _, r in mirror.requests]
    assert ranges == [None, f"bytes={len(DATA) // 2}-", f"bytes={len(DATA) * 3 // 4}-"]


def test_an_interrupted_run_resumes_and_a_server_without_ranges_restarts(tmp_path, mirror):
    mirror.files["/12/a.tar.gz"] = DATA
    remote = Remote(f"{mirror.url}/12/a.tar.gz", sha256=sha256(DATA))
    (tmp_path / "a.tar.gz.part").write_bytes(DATA[:300000])  # a killed earlier run
    assert fetch(remote, tmp_path).read_bytes() == DATA
    assert mirror.requests == [("/12/a.tar.gz", "bytes=300000-")]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "a.tar.gz.part").write_bytes(b"garbage" * 100)
    mirror.ignore_range = True  # 200 with the whole file: written from the start
    assert fetch(remote, tmp_path / "b").read_bytes() == DATA
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.tar.gz.part").write_bytes(DATA)  # complete but never renamed
    mirror.ignore_range = False
    assert fetch(remote, tmp_path / "c").read_bytes() == DATA  # 416: nothing left to fetch


def test_giving_up_keeps_the_bytes_and_says_a_rerun_resumes(tmp_path, mirror):
    mirror.files["/12/a.tar.gz"] = DATA
    mirror.drop["/12/a.tar.gz"] = 10
    with pytest.raises(
        DownloadError, match=r"closed early; \d+ bytes kept in .*a.tar.gz.part, a rerun"
    ):
        fetch(
            Remote(f"{mirror.url}/12/a.tar.gz", sha256=sha256(DATA)), tmp_path, retries=1, backoff=0
        )
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(Remote(f"{mirror.url}/12/missing.tar.gz"), tmp_path)


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_extraction_once_and_refusing_paths_out_of_the_folder(tmp_path):
    archive = tmp_path / "x.tar.gz"
    archive.write_bytes(_tar({"LibriSpeech/a.txt": b"a"}))
    assert extract_tar(archive, tmp_path / "out")
    assert (tmp_path / "out" / "LibriSpeech" / "a.txt").read_bytes() == b"a"
    assert json.loads((tmp_path / "out" / ".x.tar.gz.extracted").read_text())["size"] > 0
    assert not extract_tar(archive, tmp_path / "out")
    evil = tmp_path / "evil.tar.gz"
    evil.write_bytes(_tar({f"{os.pardir}/outside.txt": b"x"}))
    with pytest.raises((DownloadError, tarfile.TarError)):
        extract_tar(evil, tmp_path / "out2")
    assert not (tmp_path / "outside.txt").exists()
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(_tar({"a": DATA, "b": DATA})[:3000])
    with pytest.raises(DownloadError, match="broken.tar.gz: cannot extract"):
        extract_tar(broken, tmp_path / "out3")


def test_cbasr_download_librispeech_from_a_mirror(tmp_path, mirror):
    archives = {s: fake_archive(tmp_path, s) for s in ("train-clean-5", "dev-clean-2")}
    for subset, data in archives.items():
        mirror.files[f"/31/{subset}.tar.gz"] = data
    sums = tmp_path / "sums.txt"
    sums.write_text("".join(f"{sha256(d)}  {s}.tar.gz\n" for s, d in archives.items()))
    out = tmp_path / "downloads"
    args = ["librispeech", "--out", str(out), "--subsets", "train-clean-5", "dev-clean-2"]
    with pytest.raises(SystemExit) as exit_info:  # the published MD5s refuse the fake archives
        download_main([*args, "--mirror", mirror.url])
    assert exit_info.value.code == 2 and (out / "train-clean-5.tar.gz.bad").is_file()
    download_main([*args, "--mirror", mirror.url, "--sums", str(sums)])
    assert len(list((out / "LibriSpeech" / "dev-clean-2" / "103" / "121").glob("*.flac"))) == 3
    assert (out / "LibriSpeech" / "SPEAKERS.TXT").is_file()
    before = len(mirror.requests)
    download_main([*args, "--mirror", mirror.url, "--sums", str(sums)])
    assert len(mirror.requests) == before  # extracted: nothing fetched again
    bad_sums = tmp_path / "bad.txt"
    bad_sums.write_text("xyz dev-clean-2.tar.gz\n")
    with pytest.raises(SystemExit, match=r"bad.txt:1: expected"):
        download_main([*args, "--sums", str(bad_sums)])


def test_a_file_already_there_without_a_stamp_is_checked_before_it_is_used(tmp_path, mirror):
    """An archive on disk that was never checked (no stamp) is verified, not taken as it is."""
    mirror.files["/12/a.tar.gz"] = DATA
    remote = Remote(f"{mirror.url}/12/a.tar.gz", sha256=sha256(DATA))
    (tmp_path / "a.tar.gz").write_bytes(DATA[:-1] + b"x")  # copied in by hand, corrupt
    with pytest.raises(
        DownloadError, match=rf"a.tar.gz from .* is corrupt: SHA-256 \w+, published {sha256(DATA)}"
    ):
        fetch(remote, tmp_path)
    assert (tmp_path / "a.tar.gz.bad").read_bytes() == DATA[:-1] + b"x"
    assert not (tmp_path / "a.tar.gz").exists() and not (tmp_path / ".a.tar.gz.checked").exists()
    assert mirror.requests == []  # refused on disk, before any download
    assert fetch(remote, tmp_path).read_bytes() == DATA  # the rerun downloads it
    assert len(mirror.requests) == 1
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "a.tar.gz").write_bytes(DATA)  # a correct copy: checked and stamped
    assert fetch(remote, tmp_path / "good").read_bytes() == DATA
    stamp = json.loads((tmp_path / "good" / ".a.tar.gz.checked").read_text())
    assert (stamp["size"], stamp["check"], stamp["sum"]) == (len(DATA), "SHA-256", sha256(DATA))
    assert len(mirror.requests) == 1  # no download for a copy that is there and correct


def test_a_file_changed_after_its_check_or_under_another_sum_is_checked_again(tmp_path, mirror):
    """The checked stamp covers the file's size, modification time and sum: a file changed since
    (same size, or same modification time) or a new published sum is verified again."""
    mirror.files["/12/a.tar.gz"] = DATA
    remote = Remote(f"{mirror.url}/12/a.tar.gz", sha256=sha256(DATA))
    path = fetch(remote, tmp_path)
    checked = path.stat()
    path.write_bytes(DATA[:-1] + b"x")  # the same size, a later modification time
    os.utime(path, ns=(checked.st_atime_ns, checked.st_mtime_ns + 1_000_000_000))
    with pytest.raises(DownloadError, match="corrupt: SHA-256"):
        fetch(remote, tmp_path)
    path = fetch(remote, tmp_path)  # downloaded again
    checked = path.stat()
    path.write_bytes(DATA[:1000])  # another size, the modification time put back
    os.utime(path, ns=(checked.st_atime_ns, checked.st_mtime_ns))
    with pytest.raises(DownloadError, match="corrupt: SHA-256"):
        fetch(remote, tmp_path)
    path = fetch(remote, tmp_path)
    repacked = Remote(remote.url, sha256=sha256(DATA + b"!"))  # --sums of a repacked mirror
    with pytest.raises(DownloadError, match=rf"published {sha256(DATA + b'!')}"):
        fetch(repacked, tmp_path)
    assert len(mirror.requests) == 3


def test_what_a_download_is_checked_against_is_stamped_with_its_sum(tmp_path, mirror):
    """A remote's check in words and the sum its stamp records: SHA-256 before MD5 before the
    size, a gzip stream's own end, else nothing."""
    md5 = hashlib.md5(DATA).hexdigest()
    assert Remote("http://x/a.tar.gz", sha256="s", md5="m", size=3).check() == "SHA-256"
    assert Remote("http://x/a.tar.gz", md5="m", size=3).check() == "MD5"
    assert Remote("http://x/a.tar.gz", size=3).check() == "size"
    assert Remote("http://x/a.gz").check() == "gzip stream"
    assert Remote("http://x/a.tar").check() == "nothing"
    mirror.files["/13/a.tar.gz"] = DATA
    for name, remote, check, total in (
        ("md5", Remote(f"{mirror.url}/13/a.tar.gz", md5=md5, size=len(DATA)), "MD5", md5),
        ("size", Remote(f"{mirror.url}/13/a.tar.gz", size=len(DATA)), "size", len(DATA)),
    ):
        fetch(remote, tmp_path / name)
        stamp = json.loads((tmp_path / name / ".a.tar.gz.checked").read_text())
        assert (stamp["check"], stamp["sum"]) == (check, total)


def test_an_empty_gzip_and_one_cut_after_its_first_block_are_refused(tmp_path, mirror):
    mirror.files["/14/e.gz"] = b""
    with pytest.raises(DownloadError, match="an empty file, not a gzip stream"):
        fetch(Remote(f"{mirror.url}/14/e.gz"), tmp_path / "e")
    # 4 MB of text: the stream's first megabyte reads, the cut shows only at its end
    text = gzip.compress(os.urandom(2**20).hex().encode()[: 4 * 2**20])
    mirror.files["/14/lm.gz"] = text[: len(text) * 9 // 10]
    with pytest.raises(DownloadError, match="not a complete gzip stream"):
        fetch(Remote(f"{mirror.url}/14/lm.gz"), tmp_path / "g")


def test_a_download_makes_its_folders_and_backs_off_between_retries(tmp_path, mirror, monkeypatch):
    slept = []
    monkeypatch.setattr("cbasr.corpora.download.time.sleep", slept.append)
    mirror.files["/15/a.tar.gz"] = DATA
    mirror.drop["/15/a.tar.gz"] = 3
    remote = Remote(f"{mirror.url}/15/a.tar.gz", sha256=sha256(DATA))
    path = fetch(remote, tmp_path / "new" / "nested", backoff=1.5)
    assert path.read_bytes() == DATA and path.parent == tmp_path / "new" / "nested"
    assert slept == [1.5, 3.0, 6.0]  # doubling after each dropped connection
    mirror.drop["/15/a.tar.gz"] = 10
    with pytest.raises(DownloadError):
        fetch(remote, tmp_path / "capped", retries=8, backoff=20.0)
    assert slept[3:] == [20.0, 40.0, 60.0, 60.0, 60.0, 60.0, 60.0, 60.0]  # at most a minute


def test_a_refused_connection_keeps_no_bytes_and_a_missing_file_is_not_taken_as_complete(
    tmp_path, mirror
):
    closed = Mirror()
    closed.close()  # nothing listens on its port: each attempt is refused
    with pytest.raises(DownloadError, match=r"; 0 bytes kept in .*a\.tar\.gz\.part"):
        fetch(Remote(f"{closed.url}/a.tar.gz"), tmp_path / "r", retries=0)
    # bytes of an earlier run, and the file gone from the server: an HTTP error, not "complete"
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "a.tar.gz.part").write_bytes(DATA[:1000])
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(Remote(f"{mirror.url}/16/a.tar.gz"), tmp_path / "gone", retries=0)


class _Response:
    def __init__(self, **headers):
        self.headers = headers


def test_the_whole_size_comes_from_the_content_range_else_the_length_past_the_offset():
    from cbasr.corpora.download import _total

    assert _total(_Response(**{"Content-Range": "bytes 100-999/1000"}), 100) == 1000
    assert _total(_Response(**{"Content-Range": "bytes 100-999/ 1000 "}), 100) == 1000
    assert _total(_Response(**{"Content-Range": "bytes */*", "Content-Length": "900"}), 100) == 1000
    assert _total(_Response(**{"Content-Length": "900"}), 100) == 1000
    assert _total(_Response(**{"Content-Length": "chunked"}), 100) is None
    assert _total(_Response(), 0) is None


def test_a_one_byte_part_resumes_and_says_so_and_the_defaults_retry_five_times(
    tmp_path, mirror, monkeypatch, caplog
):
    mirror.files["/17/a.tar.gz"] = DATA
    remote = Remote(f"{mirror.url}/17/a.tar.gz", sha256=sha256(DATA))
    (tmp_path / "a.tar.gz.part").write_bytes(DATA[:1])
    with caplog.at_level(logging.INFO, logger="cbasr.corpora.download"):
        assert fetch(remote, tmp_path).read_bytes() == DATA
    assert mirror.requests == [("/17/a.tar.gz", "bytes=1-")]
    assert "a.tar.gz: resuming after 1 bytes" in caplog.text
    assert "starting again" not in caplog.text
    slept = []
    monkeypatch.setattr("cbasr.corpora.download.time.sleep", slept.append)
    mirror.drop["/17/a.tar.gz"] = 10
    with pytest.raises(DownloadError, match="closed early"):
        fetch(remote, tmp_path / "defaults")
    assert len(mirror.requests) == 1 + 6 and slept == [1.0, 2.0, 4.0, 8.0, 16.0]
