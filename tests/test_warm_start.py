"""Warm-start state is stored as arrays + JSON: it round-trips, and nothing in it can run code."""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from numpyro.infer.hmc import HMCState
from numpyro.infer.hmc_util import HMCAdaptState

from fleetsieve_bayes.model.warm_start import (
    KeyDigest,
    decode_tree,
    encode_tree,
    load_warm_start,
    save_warm_start,
)


class _Post(NamedTuple):
    params: dict[str, np.ndarray]
    state: Any


def _hmc_state(rng: np.random.Generator) -> HMCState:
    z = {"global": rng.normal(size=4), "class_z": rng.normal(size=(2, 3))}
    adapt = HMCAdaptState(
        np.float32(0.1),
        {("class_z", "global"): np.eye(10)},
        {("class_z", "global"): np.eye(10)},
        {("class_z", "global"): np.eye(10)},
        (np.zeros(()), np.zeros(()), np.zeros(()), np.zeros(()), np.int32(3)),
        (np.zeros((10,)), np.zeros((10, 10)), np.int32(5)),
        np.int32(2),
        np.array([0, 7], dtype=np.uint32),
    )
    return HMCState(
        np.int32(250), z, {k: v * 0 for k, v in z.items()}, np.float32(3.5), np.float32(4.0),
        None, None, np.int32(7), np.float32(0.9), np.float32(0.88), np.bool_(False), adapt,
        np.array([1, 2], dtype=np.uint32),
    )


def _same(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif a is None:
        assert b is None
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.asarray(a).dtype == np.asarray(b).dtype


def test_sampler_state_round_trips_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    key = ("nuts", (22, 2), "card", "preset")
    post = _Post(
        params={"global": rng.normal(size=(5, 4))},
        state={"key": key, "states": [_hmc_state(rng), _hmc_state(rng)]},
    )
    save_warm_start(tmp_path, post, round_no=3)
    assert [p.name for p in tmp_path.iterdir()] == ["round_3.npz"]
    loaded = load_warm_start(tmp_path, before_round=4)
    assert loaded is not None
    _same(post.params, loaded.params)
    _same(post.state["states"], loaded.state["states"])
    assert loaded.state["key"] == key  # the digest matches the very same key…
    assert loaded.state["key"] != ("nuts", (23, 2), "card", "preset")  # …and no other
    assert load_warm_start(tmp_path, before_round=3) is None  # only rounds before


def test_only_the_last_two_rounds_are_kept(tmp_path: Path) -> None:
    post = _Post(params={"a": np.zeros(3)}, state=None)
    for r in range(1, 5):
        save_warm_start(tmp_path, post, round_no=r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round_3.npz", "round_4.npz"]


class _Boom:
    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.marker),))  # type: ignore[attr-defined]


def test_a_planted_pickle_is_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    boom = _Boom()
    boom.marker = marker  # type: ignore[attr-defined]
    folder = tmp_path / "warm_start"
    folder.mkdir()
    (folder / "round_1.pkl").write_bytes(pickle.dumps({"params": boom, "state": None}))
    assert load_warm_start(folder, before_round=5) is None
    assert not marker.exists()


def _write_npz(path: Path, tree: Any, **arrays: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{"tree.json": np.frombuffer(json.dumps(tree).encode(), dtype=np.uint8)})
    path.write_bytes(buf.getvalue())


def test_crafted_npz_cannot_name_arbitrary_classes_or_hold_objects(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    folder = tmp_path / "warm_start"
    folder.mkdir()
    # A "NamedTuple" that is really os.mkdir: refused by the module allow-list.
    tree = {
        "version": 1,
        "params": {"__dict__": []},
        "state": {"__namedtuple__": "os:mkdir", "fields": [str(marker)]},
    }
    _write_npz(folder / "round_1.npz", tree)
    assert load_warm_start(folder, before_round=5) is None
    # An object array would need pickle to load: refused by allow_pickle=False.
    _write_npz(folder / "round_2.npz", tree, a0=np.array([{"a": 1}], dtype=object))
    assert load_warm_start(folder, before_round=5) is None
    assert not marker.exists()


def test_encoder_refuses_objects_it_cannot_store_without_pickle() -> None:
    with pytest.raises(TypeError):
        encode_tree({"x": object()}, {})
    with pytest.raises(TypeError):
        encode_tree(np.array([object()], dtype=object), {})
    arrays: dict[str, np.ndarray] = {}
    enc = encode_tree({"k": KeyDigest("ab"), ("a", "b"): [1, 2.5, None, "s"]}, arrays)
    assert decode_tree(json.loads(json.dumps(enc)), arrays) == {"k": KeyDigest("ab"), ("a", "b"): [1, 2.5, None, "s"]}
