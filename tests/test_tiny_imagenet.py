"""Tests of the course's photographs, chapter 00_photographs' `tiny_imagenet` and the verified download and atomic
extraction under it, offline: a small zip in the published Tiny ImageNet layout, served over HTTP on 127.0.0.1 or
read from disk, and the course's tar.gz of the same images."""

import hashlib
import http.server
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pytest
from PIL import Image

from convit_edu.augment import AUGMENTATIONS, build_mixup, build_transforms
from convit_edu.datasets import build_datasets
from convit_edu.loaders import build_loader
from convit_edu.photographs import (ARCHIVE_VARIABLE, COURSE_ARCHIVE_MD5, COURSE_DATA, TINY_IMAGENET_MD5,
                                    extract_atomically, tiny_imagenet, verify_md5)
from convit_edu.samplers import RepeatAugSampler

SHARED_ARCHIVE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tiny-imagenet-100.tar.gz"
TOP = "tiny-imagenet-200/"
WNIDS = ["n03444034", "n01443537", "n09256479", "n02124075", "n01629819"]  # wnids.txt's order, not sorted
KEPT = ["n01443537", "n02124075", "n09256479"]  # every other wnid in sorted order
WORDS = {"n00001740": "entity", "n01443537": "goldfish, Carassius auratus", "n01629819": "European fire "
         "salamander, Salamandra salamandra", "n02124075": "Egyptian cat", "n03444034": "go-kart",
         "n04067472": "reel", "n09256479": "coral reef"}  # words.txt names more wnids than the zip uses
TRAIN_PER_CLASS, VAL_PER_CLASS, TEST_IMAGES = 3, 2, 2
READY = ".ready.json"


def jpeg(seed: int) -> bytes:
    """A 64 x 64 JPEG whose pixels are random from ``seed`` (every image of an archive differs from the others)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def md5_of(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


class Published(NamedTuple):
    zip: Path  # tiny-imagenet-200.zip in the published layout
    md5: str
    tree: dict[str, bytes]  # the course's tree it gives: path relative to tiny-imagenet-100 -> bytes (no .ready.json)


def write_published_zip(folder: Path) -> Published:
    """A small ``tiny-imagenet-200.zip`` laid out as the published one: ``wnids.txt`` (unsorted), ``words.txt``,
    ``train/<wnid>/images/<wnid>_<k>.JPEG`` and ``train/<wnid>/<wnid>_boxes.txt``, ``val/images/val_<k>.JPEG``
    labelled by ``val/val_annotations.txt`` (classes interleaved), ``test/images/test_<k>.JPEG``; with the tree
    ``tiny_imagenet`` must make of it."""
    members, tree, seed = {}, {}, 0
    members["wnids.txt"] = "".join(f"{w}\n" for w in WNIDS).encode()
    members["words.txt"] = "".join(f"{w}\t{name}\n" for w, name in WORDS.items()).encode()
    for w in WNIDS:
        boxes = []
        for k in range(TRAIN_PER_CLASS):
            members[f"train/{w}/images/{w}_{k}.JPEG"], seed = jpeg(seed), seed + 1
            boxes.append(f"{w}_{k}.JPEG\t0\t0\t63\t63\n")
            if w in KEPT:
                tree[f"train/{w}/{w}_{k}.JPEG"] = members[f"train/{w}/images/{w}_{k}.JPEG"]
        members[f"train/{w}/{w}_boxes.txt"] = "".join(boxes).encode()
    annotations = []
    for k in range(VAL_PER_CLASS * len(WNIDS)):
        w = WNIDS[k % len(WNIDS)]
        members[f"val/images/val_{k}.JPEG"], seed = jpeg(seed), seed + 1
        annotations.append(f"val_{k}.JPEG\t{w}\t{k}\t1\t60\t62\n")
        if w in KEPT:
            tree[f"val/{w}/val_{k}.JPEG"] = members[f"val/images/val_{k}.JPEG"]
    members["val/val_annotations.txt"] = "".join(annotations).encode()
    for k in range(TEST_IMAGES):
        members[f"test/images/test_{k}.JPEG"], seed = jpeg(seed), seed + 1
    tree["classes.txt"] = "".join(f"{w}\t{WORDS[w]}\n" for w in KEPT).encode()
    path = folder / "tiny-imagenet-200.zip"
    with zipfile.ZipFile(path, "w") as zf:
        folders = sorted({name.rsplit("/", 1)[0] + "/" for name in members if "/" in name})
        for name in [""] + folders:  # the published zip has an entry for every folder
            zf.writestr(TOP + name, b"")
        for name, data in members.items():
            zf.writestr(TOP + name, data)
    return Published(path, md5_of(path), tree)


def write_course_tar(path: Path, tree: dict[str, bytes]) -> Path:
    """The course's ``tiny-imagenet-100.tar.gz`` of ``tree``: ``tiny-imagenet-100/{classes.txt,train,val}``."""
    with tarfile.open(path, "w:gz") as tf:
        for folder in sorted({"/".join(p.split("/")[:k]) for p in tree for k in range(1, p.count("/") + 1)}):
            info = tarfile.TarInfo(f"{COURSE_DATA}/{folder}")
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        for name, data in sorted(tree.items()):
            info = tarfile.TarInfo(f"{COURSE_DATA}/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def files_of(tree: Path) -> dict[str, bytes]:
    return {p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*") if p.is_file()}


def assert_course_tree(tree: Path, expected: dict[str, bytes], source: str) -> None:
    """``tree`` holds exactly ``expected`` (class by class, file name by file name, byte for byte) and its
    ``.ready.json``."""
    names = lambda folder: sorted(p.name for p in folder.iterdir())  # noqa: E731
    assert names(tree) == sorted([READY, "classes.txt", "train", "val"])
    assert names(tree / "train") == names(tree / "val") == KEPT
    for w in KEPT:
        assert names(tree / "train" / w) == [f"{w}_{k}.JPEG" for k in range(TRAIN_PER_CLASS)]
    val = {"n01443537": ["val_1.JPEG", "val_6.JPEG"], "n02124075": ["val_3.JPEG", "val_8.JPEG"],
           "n09256479": ["val_2.JPEG", "val_7.JPEG"]}  # by val_annotations.txt: val_k is WNIDS[k % 5]'s
    assert {w: names(tree / "val" / w) for w in KEPT} == val
    assert (tree / "classes.txt").read_text() == ("n01443537\tgoldfish, Carassius auratus\n"
                                                  "n02124075\tEgyptian cat\n" "n09256479\tcoral reef\n")
    files = files_of(tree)
    ready = json.loads(files.pop(READY))
    assert files.keys() == expected.keys()  # no test/ images, no boxes files, no annotations, no wnids.txt
    assert files == expected  # every file's bytes are those of the source's image
    assert ready == {"classes": 3, "train": 3 * TRAIN_PER_CLASS, "val": 3 * VAL_PER_CLASS, "source": source}


def leftovers(root: Path) -> list[str]:
    """Everything in ``root`` (hidden names included), or [] when it does not exist."""
    return sorted(os.listdir(root)) if root.exists() else []


def finishes_within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """Run ``call()`` in a thread and return what it raised (None if nothing), failing when it is still running
    after ``seconds``: a liveness bound (no hang), not a speed assertion."""
    raised = []

    def target():
        try:
            call()
            raised.append(None)
        except BaseException as e:  # KeyboardInterrupt too: handed back to the test
            raised.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s: the timeout did not apply"
    return raised[0]


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(autouse=True)
def no_archive_variable(monkeypatch):
    """CI names the shared archive in ``CONVIT_EDU_TINY_IMAGENET``: each test here says which source it means;
    requests to 127.0.0.1 bypass any proxy of the environment."""
    monkeypatch.delenv(ARCHIVE_VARIABLE, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1")


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Published:
    return write_published_zip(tmp_path_factory.mktemp("published"))


@pytest.fixture(scope="module")
def course_tar(published, tmp_path_factory) -> Path:
    return write_course_tar(tmp_path_factory.mktemp("course") / f"{COURSE_DATA}.tar.gz", published.tree)


class Server(NamedTuple):
    url: str  # the zip's URL
    requests: list[str]  # the paths requested so far


@pytest.fixture
def server(published):
    """The published zip's folder over HTTP on 127.0.0.1 (a free port), counting requests; shut down after."""
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(published.zip.parent), **kwargs)

        def send_head(self):
            requests.append(self.path)
            return super().send_head()

        def log_message(self, *args):  # no request log on stderr
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield Server(f"http://127.0.0.1:{httpd.server_address[1]}/{published.zip.name}", requests)
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture
def refused_url():
    """A URL on a port of 127.0.0.1 that refuses connections (bound, not listening)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}/tiny-imagenet-200.zip"


@pytest.fixture
def silent_url():
    """A URL on a port of 127.0.0.1 that listens but never answers: the kernel completes the connection, nobody
    accepts it or sends a byte."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/tiny-imagenet-200.zip"


# ------------------------------------------------------------------------------------------ download


def test_download_keeps_every_other_class_flattened_with_val_sorted_into_class_folders(tmp_path, published, server,
                                                                                         capsys):
    root = tmp_path / "data"
    tree = tiny_imagenet(root, url=server.url, md5=published.md5, timeout=10)
    assert tree == root / COURSE_DATA
    assert_course_tree(tree, published.tree, "tiny-imagenet-200.zip")
    assert leftovers(root) == [COURSE_DATA, "tiny-imagenet-200.zip"]  # no .part, no hidden partial folder
    assert (root / "tiny-imagenet-200.zip").read_bytes() == published.zip.read_bytes()
    out = capsys.readouterr().out
    assert f"downloading {server.url}" in out and f"{tree}: 3 classes, 9 training and 6 validation images" in out


def test_a_ready_tree_is_reused_without_contacting_the_server(tmp_path, published, server, capsys):
    tree = tiny_imagenet(tmp_path, url=server.url, md5=published.md5, timeout=10)
    served = len(server.requests)
    assert served >= 1
    capsys.readouterr()
    assert tiny_imagenet(tmp_path, url=server.url, md5=published.md5, timeout=10) == tree
    assert len(server.requests) == served
    assert capsys.readouterr().out.startswith(f"{tree} is ready: 3 classes, 9 training and 6 validation images")
    assert_course_tree(tree, published.tree, "tiny-imagenet-200.zip")


def test_a_download_with_the_wrong_md5_is_an_error_naming_both_sums_and_is_removed(tmp_path, published, server):
    wrong = "0123456789abcdef0123456789abcdef"
    with pytest.raises(ValueError) as e:
        tiny_imagenet(tmp_path, url=server.url, md5=wrong, timeout=10)
    message = str(e.value)
    assert str(tmp_path / "tiny-imagenet-200.zip") in message and published.md5 in message and wrong in message
    assert server.requests and leftovers(tmp_path) == []  # no .part, no zip, no tree, no partial folder


def test_a_part_file_left_by_an_interrupted_download_is_downloaded_again(tmp_path, published, server):
    (tmp_path / "tiny-imagenet-200.zip.part").write_bytes(b"the first bytes of an interrupted download")
    tree = tiny_imagenet(tmp_path, url=server.url, md5=published.md5, timeout=10)
    assert_course_tree(tree, published.tree, "tiny-imagenet-200.zip")
    assert server.requests and leftovers(tmp_path) == [COURSE_DATA, "tiny-imagenet-200.zip"]


def test_a_server_that_never_answers_is_an_error_naming_the_url_after_the_timeout(tmp_path, silent_url):
    error = finishes_within(30, lambda: tiny_imagenet(tmp_path, url=silent_url, md5="0" * 32, timeout=1))
    assert isinstance(error, ConnectionError), error
    assert silent_url in str(error) and "--archive" in str(error) and "timed out" in str(error)
    assert leftovers(tmp_path) == []


def test_a_refused_connection_is_an_error_naming_the_url(tmp_path, refused_url):
    error = finishes_within(30, lambda: tiny_imagenet(tmp_path, url=refused_url, md5="0" * 32, timeout=1))
    assert isinstance(error, ConnectionError), error
    assert refused_url in str(error) and "--archive" in str(error) and "refused" in str(error)
    assert leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------------ local archives


def test_the_zip_and_the_course_tar_give_the_same_tree(tmp_path, published, course_tar, refused_url):
    from_zip = tiny_imagenet(tmp_path / "a", archive=published.zip, md5=published.md5, url=refused_url)
    from_tar = tiny_imagenet(tmp_path / "b", archive=course_tar, md5=md5_of(course_tar), url=refused_url)
    assert_course_tree(from_zip, published.tree, "tiny-imagenet-200.zip")
    assert_course_tree(from_tar, published.tree, f"{COURSE_DATA}.tar.gz")
    assert leftovers(tmp_path / "a") == leftovers(tmp_path / "b") == [COURSE_DATA]  # nothing downloaded
    assert published.zip.is_file() and course_tar.is_file()  # an archive given is read, never moved or removed


def test_without_md5_an_archive_must_be_the_published_one_of_its_kind(tmp_path, published, course_tar):
    for archive, expected in ((published.zip, TINY_IMAGENET_MD5), (course_tar, COURSE_ARCHIVE_MD5)):
        with pytest.raises(ValueError) as e:
            tiny_imagenet(tmp_path, archive=archive)
        assert str(archive) in str(e.value) and md5_of(archive) in str(e.value) and expected in str(e.value)
        assert archive.is_file() and leftovers(tmp_path) == []


def test_a_missing_archive_is_an_error_naming_it(tmp_path):
    absent = tmp_path / "elsewhere" / "tiny-imagenet-200.zip"
    with pytest.raises(FileNotFoundError) as e:
        tiny_imagenet(tmp_path / "data", archive=absent)
    assert str(absent) in str(e.value) and "--archive" in str(e.value) and ARCHIVE_VARIABLE not in str(e.value)
    assert leftovers(tmp_path / "data") == []


def test_the_environment_variable_names_the_archive_when_none_is_given(tmp_path, published, refused_url,
                                                                         monkeypatch):
    monkeypatch.setenv(ARCHIVE_VARIABLE, str(published.zip))
    tree = tiny_imagenet(tmp_path / "a", md5=published.md5, url=refused_url)  # the URL would fail: not used
    assert_course_tree(tree, published.tree, "tiny-imagenet-200.zip")
    absent = tmp_path / "absent.tar.gz"
    monkeypatch.setenv(ARCHIVE_VARIABLE, str(absent))
    with pytest.raises(FileNotFoundError) as e:
        tiny_imagenet(tmp_path / "b", md5=published.md5, url=refused_url)
    assert str(absent) in str(e.value) and ARCHIVE_VARIABLE in str(e.value)
    tree = tiny_imagenet(tmp_path / "c", archive=published.zip, md5=published.md5)  # an argument comes first
    assert_course_tree(tree, published.tree, "tiny-imagenet-200.zip")


# ------------------------------------------------------------------------------------------ interrupted, stale, taken


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_an_extraction_interrupted_half_way_leaves_nothing_and_the_next_run_completes(tmp_path, published,
                                                                                      course_tar, kind):
    archive, md5 = (published.zip, published.md5) if kind == "zip" else (course_tar, md5_of(course_tar))
    write_bytes, written = Path.write_bytes, []

    def interrupted(self, data):
        if len(written) == 5:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the extraction
        written.append(self)
        return write_bytes(self, data)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "write_bytes", interrupted)
        with pytest.raises(KeyboardInterrupt):
            tiny_imagenet(tmp_path, archive=archive, md5=md5)
    hidden = f".{COURSE_DATA}.partial-{socket.gethostname()}-{os.getpid()}"
    assert len(written) == 5 and all(p.relative_to(tmp_path).parts[0] == hidden for p in written)  # then stopped
    assert leftovers(tmp_path) == []
    tree = tiny_imagenet(tmp_path, archive=archive, md5=md5)
    assert_course_tree(tree, published.tree, archive.name)
    assert leftovers(tmp_path) == [COURSE_DATA]


def test_a_partial_folder_of_a_dead_process_is_removed_by_the_next_run_and_a_live_ones_is_kept(tmp_path, published):
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()  # its pid is now a dead process's
    host = socket.gethostname()
    stale, live, elsewhere = (tmp_path / f".{COURSE_DATA}.partial-{who}" for who in
                              (f"{host}-{child.pid}", f"{host}-1", f"another-machine-{child.pid}"))
    for folder in (stale, live, elsewhere):
        (folder / "train" / KEPT[0]).mkdir(parents=True)
        (folder / "train" / KEPT[0] / "half.JPEG").write_bytes(b"\xff\xd8")
    tree = tiny_imagenet(tmp_path, archive=published.zip, md5=published.md5)
    assert_course_tree(tree, published.tree, "tiny-imagenet-200.zip")
    # pid 1 is alive, and a process of another machine (a shared file system) cannot be checked: both may be at work
    assert leftovers(tmp_path) == sorted([live.name, elsewhere.name, COURSE_DATA])


def test_an_extraction_that_another_process_completed_first_keeps_that_tree(tmp_path, published):
    def write_while_another_finishes(tree: Path) -> dict:
        (tree / "mine.txt").parent.mkdir(parents=True)
        (tree / "mine.txt").write_text("ours")
        (tmp_path / "dest").mkdir()  # the other process renames its complete copy into place meanwhile
        (tmp_path / "dest" / "theirs.txt").write_text("theirs")
        return {"files": 1}

    assert extract_atomically(write_while_another_finishes, tmp_path / "dest") == {"files": 1}
    assert leftovers(tmp_path) == ["dest"] and [p.name for p in (tmp_path / "dest").iterdir()] == ["theirs.txt"]


def test_a_folder_not_made_by_tiny_imagenet_is_never_overwritten(tmp_path, published):
    dest = tmp_path / COURSE_DATA
    (dest / "train").mkdir(parents=True)
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError) as e:
        tiny_imagenet(tmp_path, archive=published.zip, md5=published.md5)
    assert str(dest) in str(e.value) and READY in str(e.value)
    assert files_of(dest) == {"notes.txt": b"mine"} and leftovers(tmp_path) == [COURSE_DATA]


# ------------------------------------------------------------------------------------------ the tree in use


def test_the_tree_is_an_imagenet_folder_read_with_its_class_names_through_the_training_pipeline(tmp_path, published):
    tree = tiny_imagenet(tmp_path, archive=published.zip, md5=published.md5)
    train_tf, val_tf = build_transforms(AUGMENTATIONS["deit"])
    train, val, names = build_datasets("imagefolder", tree, train_transform=train_tf, val_transform=val_tf,
                                       fraction=2 / 3)
    assert train.classes == val.classes == KEPT and names == ["goldfish", "Egyptian cat", "coral reef"]
    assert [Path(p).name for p, _ in train.samples] == [f"{w}_{k}.JPEG" for w in KEPT for k in range(2)]
    assert len(val) == 3 * VAL_PER_CLASS and {Path(p).parent.name for p, _ in val.samples} == set(KEPT)
    loader = build_loader(train, 3, RepeatAugSampler(len(train), repeats=3), num_workers=0, seed=0, drop_last=True)
    mix = build_mixup(AUGMENTATIONS["deit"], len(names))
    for images, labels in loader:
        mixed, targets = mix(images, labels)
        assert mixed.shape == (3, 3, 224, 224) and targets.shape == (3, 3)


@pytest.mark.skipif(not SHARED_ARCHIVE.is_file(), reason=f"shared archive {SHARED_ARCHIVE} not present")
def test_the_course_archive_md5_is_that_of_the_shared_archive():
    verify_md5(SHARED_ARCHIVE, COURSE_ARCHIVE_MD5)  # tiny_imagenet(archive=it) checks this sum by default
