"""Probes of tests/robustness/probe.py on the data path: HDF5 sources, output folders, configs, shards and manifests."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from b2t.config import TINY_CONFIG
from tests.robustness.probe_base import Case, Probe, Workspace, copy, eval_args, preprocess_args, sets, train_args, truncate

# --- HDF5 sources ---------------------------------------------------------------------------------

def first_trial_file(src: Path) -> Path:
    return sorted(src.glob("*/data_train.hdf5"))[0]


def edit_trial(edit: Callable[[h5py.Group], None]) -> Callable[[Workspace, Path], Case]:
    """A preprocess probe: the first train trial of a copied tree, edited; the message names file and trial."""
    def make(ws: Workspace, d: Path) -> Case:
        src = copy(ws.src, d)
        path = first_trial_file(src)
        with h5py.File(path, "r+") as f:
            edit(f["trial_0000"])
        return preprocess_args(src, d / "out"), [str(path), "trial_0000"]
    return make


def replace_features(values: np.ndarray) -> Callable[[h5py.Group], None]:
    def edit(g: h5py.Group) -> None:
        del g["input_features"]
        g.create_dataset("input_features", data=values)
        g.attrs["n_time_steps"] = np.int64(len(values))
    return edit


def set_value(dataset: str, index: tuple, value: float) -> Callable[[h5py.Group], None]:
    def edit(g: h5py.Group) -> None:
        g[dataset][index] = value
    return edit


def set_attr(name: str, value: object, dtype: object = None) -> Callable[[h5py.Group], None]:
    def edit(g: h5py.Group) -> None:
        if value is None:
            del g.attrs[name]
        else:
            g.attrs.create(name, value, dtype=dtype)
    return edit


def edit_file(edit: Callable[[Path], object]) -> Callable[[Workspace, Path], Case]:
    """A preprocess probe on a copied tree changed by `edit(src)`; the message names what edit returns."""
    def make(ws: Workspace, d: Path) -> Case:
        src = copy(ws.src, d)
        named = edit(src)
        return preprocess_args(src, d / "out"), [str(named)] if named else []
    return make


def _symlink_session(src: Path) -> None:
    session = sorted(p for p in src.iterdir() if p.is_dir())[0]
    elsewhere = src.parent / "elsewhere"
    shutil.move(session, elsewhere)
    session.symlink_to(elsewhere)


def _test_only(src: Path) -> None:
    session = sorted(p for p in src.iterdir() if p.is_dir())[0]
    for name in ("data_train.hdf5", "data_val.hdf5"):
        (session / name).unlink()


def _duplicate(src: Path) -> Path:
    session = sorted(p for p in src.iterdir() if p.is_dir())[0]
    shutil.copytree(session, src / "more" / session.name)
    return src / "more" / session.name


def _foreign(src: Path) -> Path:
    a, b = sorted(p for p in src.iterdir() if p.is_dir())
    shutil.copy(a / "data_val.hdf5", b / "data_val.hdf5")
    return b / "data_val.hdf5"


def _extra_object(src: Path) -> Path:
    path = first_trial_file(src)
    with h5py.File(path, "r+") as f:
        f.create_dataset("notes", data=np.zeros(3))
    return path


def _folder_for_file(src: Path) -> Path:
    path = first_trial_file(src)
    path.unlink()
    path.mkdir()
    return path


def drop(dataset: str) -> Callable[[h5py.Group], None]:
    def edit(g: h5py.Group) -> None:
        del g[dataset]
    return edit


def sessions_in_manifest(n: int) -> Callable[[Path, str], str | None]:
    def check(d: Path, output: str) -> str | None:
        sessions = json.loads((d / "out" / "manifest.json").read_text())["sessions"]
        return None if len(sessions) == n else f"{len(sessions)} sessions in the manifest, expected {n}"
    return check


def warned(word: str) -> Callable[[Path, str], str | None]:
    return lambda d, output: None if "warning" in output and word in output else f"no warning naming {word!r}"


HDF5_PROBES = [
    Probe("truncated HDF5 file", "b2t-preprocess", edit_file(lambda s: truncate(first_trial_file(s)))),
    Probe("text file named data_train.hdf5", "b2t-preprocess",
          edit_file(lambda s: first_trial_file(s).write_text("not hdf5") and first_trial_file(s))),
    Probe("NaN feature", "b2t-preprocess", edit_trial(set_value("input_features", (3, 7), np.nan))),
    Probe("Inf feature", "b2t-preprocess", edit_trial(set_value("input_features", (3, 7), np.inf))),
    Probe("feature beyond bf16 (1e300 float64)", "b2t-preprocess",
          edit_trial(replace_features(np.full((40, 512), 1e300)))),
    Probe("511 feature channels", "b2t-preprocess", edit_trial(replace_features(np.zeros((40, 511), np.float32)))),
    Probe("integer features", "b2t-preprocess", edit_trial(replace_features(np.zeros((40, 512), np.int16)))),
    Probe("n_time_steps attribute disagrees", "b2t-preprocess", edit_trial(set_attr("n_time_steps", np.int64(7)))),
    Probe("seq_len beyond seq_class_ids", "b2t-preprocess", edit_trial(set_attr("seq_len", np.int64(9999)))),
    Probe("trial of 0 bins", "b2t-preprocess", edit_trial(replace_features(np.zeros((0, 512), np.float32)))),
    Probe("1-D input_features", "b2t-preprocess", edit_trial(replace_features(np.zeros(512, np.float32)))),
    Probe("trial without input_features", "b2t-preprocess", edit_trial(drop("input_features"))),
    Probe("float label ids", "b2t-preprocess", edit_trial(lambda g: (drop("seq_class_ids")(g), g.create_dataset(
        "seq_class_ids", data=np.full(500, 2.5))))),
    Probe("data_train.hdf5 a folder", "b2t-preprocess", edit_file(_folder_for_file)),
    Probe("label id 41", "b2t-preprocess", edit_trial(set_value("seq_class_ids", (0,), 41))),
    Probe("label id 0 inside seq_len", "b2t-preprocess", edit_trial(set_value("seq_class_ids", (0,), 0))),
    Probe("missing sentence_label", "b2t-preprocess", edit_trial(set_attr("sentence_label", None))),
    Probe("empty sentence_label (case 5)", "b2t-preprocess", edit_trial(set_attr("sentence_label", " "))),
    Probe("non-UTF-8 sentence_label (case 6)", "b2t-preprocess",
          edit_trial(set_attr("sentence_label", b"caf\xe9", h5py.string_dtype("utf-8")))),
    Probe("string n_time_steps", "b2t-preprocess", edit_trial(set_attr("n_time_steps", "forty"))),
    Probe("unexpected top-level object", "b2t-preprocess", edit_file(_extra_object)),
    Probe("no session below SRC", "b2t-preprocess",
          lambda ws, d: (preprocess_args(Path(tempfile.mkdtemp(dir=d)), d / "out"), ["no session found"])),
    Probe("duplicate session names", "b2t-preprocess", edit_file(_duplicate)),
    Probe("file moved to another session", "b2t-preprocess", edit_file(_foreign)),
    Probe("unexpected data_*.hdf5 name", "b2t-preprocess",
          edit_file(lambda s: shutil.copy(first_trial_file(s), first_trial_file(s).parent / "data_extra.hdf5"))),
    Probe("symlinked session folder (case 3)", "b2t-preprocess", edit_file(_symlink_session), expect="ok",
          check=sessions_in_manifest(2)),
    Probe("session with only test data (case 4)", "b2t-preprocess", edit_file(_test_only), expect="ok",
          check=warned("no data_train.hdf5")),
    Probe("empty session folder", "b2t-preprocess", edit_file(lambda s: (s / "t15.2099.01.01").mkdir()),
          expect="ok", check=warned("empty folder")),
]


# --- output locations, configs ---------------------------------------------------------------------

def _foreign_out(ws: Workspace, d: Path) -> Case:
    (d / "out").mkdir()
    (d / "out" / "thesis.tex").write_text("the user's own file")
    return preprocess_args(ws.src, d / "out"), [str(d / "out")]


def _nothing_but(*names: str) -> Callable[[Path, str], str | None]:
    def check(d: Path, output: str) -> str | None:
        left = sorted(p.name for p in (d / "out").iterdir())
        return None if left == sorted(names) else f"left behind in OUT: {left}"
    return check


def _under_file(ws: Workspace, d: Path) -> Case:
    (d / "a_file").write_text("x")
    return preprocess_args(ws.src, d / "a_file" / "out"), [str(d / "a_file")]


def _src_a_file(ws: Workspace, d: Path) -> Case:
    (d / "src.txt").write_text("not a folder")
    return preprocess_args(d / "src.txt", d / "out"), [str(d / "src.txt")]


def _other_config(ws: Workspace, d: Path) -> Case:
    out = copy(ws.shards, d)
    return preprocess_args(ws.src, out, *sets("data.n_buckets=2")), ["data.n_buckets"]


def config_file(text: str | bytes, *names: str) -> Callable[[Workspace, Path], Case]:
    """A b2t-plan probe (no data, nothing compiled) with this config file."""
    def make(ws: Workspace, d: Path) -> Case:
        path = d / "c.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return ["--config", str(path)], [str(path), *names]
    return make


def override(*items: str, names: tuple[str, ...] = ()) -> Callable[[Workspace, Path], Case]:
    return lambda ws, d: (["--config", str(TINY_CONFIG), *sets(*items)], list(names))


OUTPUT_AND_CONFIG_PROBES = [
    Probe("OUT under a regular file", "b2t-preprocess", _under_file),
    Probe("OUT a foreign non-empty folder (+ stray lock)", "b2t-preprocess", _foreign_out, check=_nothing_but("thesis.tex")),
    Probe("OUT made with another config", "b2t-preprocess", _other_config),
    Probe("SRC a regular file", "b2t-preprocess", _src_a_file),
    Probe("SRC missing", "b2t-preprocess", lambda ws, d: (preprocess_args(d / "nowhere", d / "out"), [str(d / "nowhere")])),
    Probe("--config a missing file", "b2t-plan",
          lambda ws, d: (["--config", str(d / "missing.yaml")], [str(d / "missing.yaml")])),
    Probe("unknown config key", "b2t-plan", config_file("optim:\n  learning_rate: 0.1\n", "learning_rate")),
    Probe("unknown config section", "b2t-plan", config_file("optimiser:\n  lr: 0.1\n", "optimiser")),
    Probe("string for an integer", "b2t-plan", config_file("train:\n  steps: many\n", "train.steps")),
    Probe("true for an integer", "b2t-plan", config_file("train:\n  steps: true\n", "train.steps")),
    Probe("float for an integer", "b2t-plan", config_file("train:\n  steps: 2.5\n", "train.steps")),
    Probe("list for a number", "b2t-plan", config_file("optim:\n  lr: [1, 2]\n", "optim.lr")),
    Probe("section given a value", "b2t-plan", config_file("optim: 3\n", "optim")),
    Probe("null for a number", "b2t-plan", config_file("optim:\n  lr: null\n", "optim.lr")),
    Probe("number for a string", "b2t-plan", config_file("train:\n  backend: 3\n", "train.backend")),
    Probe("negative learning rate", "b2t-plan", config_file("optim:\n  lr: -0.1\n", "optim.lr")),
    Probe("NaN learning rate", "b2t-plan", config_file("optim:\n  lr: .nan\n", "optim.lr")),
    Probe("duplicate key in YAML", "b2t-plan", config_file("optim:\n  lr: 0.1\n  lr: 0.2\n", "c.yaml:3", "lr")),
    Probe("out-of-range value", "b2t-plan", config_file("data:\n  n_buckets: 0\n", "data.n_buckets")),
    Probe("unknown backend", "b2t-plan", config_file("train:\n  backend: tpu\n", "train.backend")),
    Probe("empty config file (case 7)", "b2t-plan", config_file("# nothing\n", "empty")),
    Probe("malformed YAML (case 14)", "b2t-plan", config_file("optim:\n  lr: [0.1\ntrain:\n", "c.yaml:")),
    Probe("malformed YAML in b2t-preprocess (case 14)", "b2t-preprocess",
          lambda ws, d: ((d / "c.yaml").write_text("data: {n_buckets: 2\n") and None
                         or [str(ws.src), str(d / "out"), "--config", str(d / "c.yaml")], [str(d / "c.yaml")])),
    Probe("config file a YAML list", "b2t-plan", config_file("- optim\n", "mapping")),
    Probe("non-UTF-8 config file", "b2t-plan", config_file(b"optim:\n  lr: 0.1 \xff\n", "UTF-8")),
    Probe("lr: 1e-3 in a file (case 17)", "b2t-plan", config_file("optim:\n  lr: 1e-3\n  eps: +1E-4\n"),
          expect="ok"),
    Probe("--set optim.lr=1e6 (case 17)", "b2t-plan", override("optim.lr=1e6", "optim.lr_day=.5"), expect="ok"),
    Probe("--set without a section", "b2t-plan", override("lr=0.1", names=("lr=0.1",))),
    Probe("--set with a malformed value", "b2t-plan", override("optim.lr=[", names=("optim.lr=[",))),
    Probe("--set an unknown key", "b2t-plan", override("optim.learning_rate=0.1", names=("learning_rate",))),
]


# --- shards and manifests ---------------------------------------------------------------------------

def dataset_probe(change: Callable[[Path], object], cli_name: str = "b2t-train",
                  extra: tuple[str, ...] = ()) -> Callable[[Workspace, Path], Case]:
    """A copied dataset changed by `change(dataset)`, then trained on (or verified, or evaluated)."""
    def make(ws: Workspace, d: Path) -> Case:
        ds = copy(ws.shards, d)
        named = change(ds)
        names = [str(named)] if named else []
        if cli_name == "b2t-preprocess":
            return ["verify", str(ds)], names
        if cli_name == "b2t-eval":
            return eval_args(ws, ds, *extra), names
        return train_args(ds, d / "run", *extra), names
    return make


def first_shard(ds: Path, split: str = "train") -> Path:
    return ds / json.loads((ds / "manifest.json").read_text())["shards"][0 if split == "train" else -1]["name"]


def _flip(path: Path, offset: int = -2000) -> Path:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _manifest(ds: Path, edit: Callable[[dict], object]) -> Path:
    path = ds / "manifest.json"
    raw = json.loads(path.read_text())
    raw = edit(raw) or raw
    path.write_text(json.dumps(raw))
    return path


def _escape(ds: Path) -> Path:
    other = ds.parent / "other-dataset"
    shutil.copytree(ds, other)
    name = first_shard(ds).name
    _manifest(ds, lambda m: m["shards"][0].update(name=f"../other-dataset/{name}"))
    return ds / "manifest.json"


def _tamper(field: str, value: int) -> Callable[[Path], Path]:
    """Change one row value of the first train shard and update the manifest's size and sha256 to match."""
    return _rewrite(lambda tensors, meta: tensors[field].view(-1).__setitem__(0, value))


def _rewrite(edit: Callable[[dict, dict], object]) -> Callable[[Path], Path]:
    """Edit (tensors, meta) of the first sample of the first train shard in place, and update the
    manifest's size and sha256 to match: only the reader's own checks can tell."""
    def change(ds: Path) -> Path:
        from webdataset import TarWriter

        from b2t.data.manifest import file_sha256
        from b2t.data.mapped_tar import shard_samples
        from b2t.data.sample import decode_sample, encode_sample

        path = first_shard(ds)
        samples = [decode_sample(s) + (s["__key__"],) for s in shard_samples(str(path))]
        with TarWriter(str(path.with_suffix(".new"))) as tar:
            for i, (tensors, meta, key) in enumerate(samples):
                tensors = {k: v.clone() for k, v in tensors.items()}
                if i == 0:
                    edit(tensors, meta)
                tar.write(encode_sample(key, tensors, meta))
        path.with_suffix(".new").replace(path)
        _manifest(ds, lambda m: m["shards"][0].update(bytes=path.stat().st_size, sha256=file_sha256(path)))
        return path
    return change


def _shard_a_folder(ds: Path) -> str:
    path = first_shard(ds)
    path.unlink()
    path.mkdir()
    return path.name


SHARD_PROBES = [
    Probe("shard a folder", "b2t-train", dataset_probe(_shard_a_folder)),
    Probe("valid flag byte 2 in a shard, sha256 updated", "b2t-train",
          dataset_probe(_rewrite(lambda t, m: t["valid"].view(__import__("torch").uint8).__setitem__(0, 2)))),
    Probe("meta bucket 9 in a shard, sha256 updated", "b2t-train",
          dataset_probe(_rewrite(lambda t, m: m.__setitem__("bucket", 9)))),
    Probe("float32 features in a shard, sha256 updated", "b2t-train",
          dataset_probe(_rewrite(lambda t, m: t.__setitem__("features", t["features"].float())))),
    Probe("manifest without shards", "b2t-train",
          dataset_probe(lambda ds: _manifest(ds, lambda m: m.pop("shards") and None))),
    Probe("manifest n_batches a string", "b2t-train",
          dataset_probe(lambda ds: _manifest(ds, lambda m: m["shards"][0].update(n_batches="two")))),
    Probe("deleted shard", "b2t-train", dataset_probe(lambda ds: first_shard(ds).unlink() or first_shard(ds).name)),
    Probe("truncated shard", "b2t-train", dataset_probe(lambda ds: truncate(first_shard(ds), 0.7).name)),
    Probe("flipped byte, --verify-data", "b2t-train", dataset_probe(lambda ds: _flip(first_shard(ds)).name,
                                                                     extra=("--verify-data",))),
    Probe("flipped byte, verify", "b2t-preprocess", dataset_probe(lambda ds: _flip(first_shard(ds)).name,
                                                                  "b2t-preprocess")),
    Probe("truncated shard, verify", "b2t-preprocess", dataset_probe(lambda ds: truncate(first_shard(ds)).name,
                                                                     "b2t-preprocess")),
    Probe("foreign shard under a listed name", "b2t-train",
          dataset_probe(lambda ds: shutil.copy(first_shard(ds, "val"), first_shard(ds)) and first_shard(ds).name)),
    Probe("no manifest", "b2t-train", dataset_probe(lambda ds: (ds / "manifest.json").unlink() or "manifest.json")),
    Probe("manifest not JSON", "b2t-train",
          dataset_probe(lambda ds: (ds / "manifest.json").write_text("{oops") and ds / "manifest.json")),
    Probe("binary manifest", "b2t-train",
          dataset_probe(lambda ds: (ds / "manifest.json").write_bytes(b"\xff\xfe\x00") and ds / "manifest.json")),
    Probe("manifest a JSON list, train (case 13)", "b2t-train",
          dataset_probe(lambda ds: _manifest(ds, lambda m: [m]))),
    Probe("manifest a JSON list, verify (case 13)", "b2t-preprocess",
          dataset_probe(lambda ds: _manifest(ds, lambda m: [m]), "b2t-preprocess")),
    Probe("manifest a JSON list, eval (case 13)", "b2t-eval",
          dataset_probe(lambda ds: _manifest(ds, lambda m: [m]), "b2t-eval")),
    Probe("manifest of another format version", "b2t-train",
          dataset_probe(lambda ds: _manifest(ds, lambda m: m.update(version=99)))),
    Probe("manifest without sessions", "b2t-train",
          dataset_probe(lambda ds: _manifest(ds, lambda m: m.pop("sessions") and None))),
    Probe("manifest shard name outside the dataset (case 1)", "b2t-train", dataset_probe(_escape)),
    Probe("manifest shard name outside the dataset, verify (case 1)", "b2t-preprocess",
          dataset_probe(_escape, "b2t-preprocess")),
    Probe("label id 99 in a shard, sha256 updated (case 2)", "b2t-train",
          dataset_probe(_tamper("seq_class_ids", 99))),
    Probe("label id 99 in a shard, verify (case 2)", "b2t-preprocess",
          dataset_probe(_tamper("seq_class_ids", 99), "b2t-preprocess")),
    Probe("n_time_steps 532676675 in a shard (case 12)", "b2t-train",
          dataset_probe(_tamper("n_time_steps", 532676675))),
    Probe("day index 77 in a shard", "b2t-train", dataset_probe(_tamper("day_indices", 77))),
]
