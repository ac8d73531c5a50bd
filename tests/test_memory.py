"""Replay memory: wraparound, episode boundaries, shapes and dtypes, datasets, and tmrl-style custom memories."""

from __future__ import annotations

import functools
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from netrl.memory import MemoryDataloading, ReplayMemory, save_dataset
from netrl.samples import Buffer, BufferBuilder


def episode_rows(builder: BufferBuilder, start: int, length: int, terminal: bool) -> list[Buffer]:
    """Rows whose observation encodes (step index) so transitions can be checked: obs = [t, t*10]."""
    out = []
    builder.add(np.array([-1.0], np.float32), np.array([start, start * 10], np.float32), 0.0, False, False, True, 0)
    for t in range(start + 1, start + length + 1):
        last = t == start + length
        builder.add(np.array([float(t)], np.float32), np.array([t, t * 10], np.float32), float(t),
                    last and terminal, last and not terminal, False, t)
        if builder.full or len(builder) >= 3:
            out.append(builder.cut())
    tail = builder.cut()
    return [b for b in [*out, tail] if b is not None]


def fill(memory: ReplayMemory, episodes: list[tuple[int, int, bool]]) -> None:
    builder = BufferBuilder(capacity=6, overlap=1)
    for start, length, terminal in episodes:
        for buf in episode_rows(builder, start, length, terminal):
            memory.append_buffer(buf)


def check_transitions(o: np.ndarray, a: np.ndarray, r: np.ndarray, o2: np.ndarray) -> None:
    """Every sampled transition must be a real consecutive step of one episode: o2 = o + 1, a = r = o2."""
    np.testing.assert_array_equal(o2[:, 0], o[:, 0] + 1)
    np.testing.assert_array_equal(a[:, 0], o2[:, 0])
    np.testing.assert_array_equal(r, o2[:, 0])
    np.testing.assert_array_equal(o[:, 1], o[:, 0] * 10)


def test_sample_shapes_dtypes_and_device() -> None:
    mem = ReplayMemory(memory_size=100, batch_size=16, seed=0)
    fill(mem, [(0, 20, True)])
    batch = mem.sample()
    assert batch.obs.shape == (16, 2) and batch.next_obs.shape == (16, 2) and batch.act.shape == (16, 1)
    assert batch.rew.shape == batch.terminated.shape == batch.truncated.shape == (16,)
    for t in (batch.obs, batch.act, batch.rew, batch.next_obs, batch.terminated, batch.truncated):
        assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu"
    check_transitions(batch.obs.numpy(), batch.act.numpy(), batch.rew.numpy(), batch.next_obs.numpy())


def test_transitions_never_cross_episode_or_packet_boundaries() -> None:
    mem = ReplayMemory(memory_size=1000, batch_size=512, seed=1)
    fill(mem, [(0, 7, True), (100, 5, False), (200, 9, True)])
    assert len(mem) == 7 + 5 + 9  # one transition per env step, none across resets
    b = mem.sample()
    check_transitions(b.obs.numpy(), b.act.numpy(), b.rew.numpy(), b.next_obs.numpy())
    starts = {0, 100, 200}
    assert not set(b.next_obs.numpy()[:, 0].astype(int)) & starts  # nothing ends on a reset row


def test_terminated_and_truncated_stay_separate() -> None:
    mem = ReplayMemory(memory_size=100, batch_size=1, seed=0)
    fill(mem, [(0, 3, True), (10, 3, False)])
    ends = {}
    for i in range(len(mem)):
        *_, o2, term, trunc, _ = mem.get_transition(i)
        ends[int(o2[0])] = (term, trunc)
    assert ends[3] == (True, False) and ends[13] == (False, True) and ends[2] == (False, False)


def test_wraparound_keeps_the_newest_rows_and_valid_transitions() -> None:
    mem = ReplayMemory(memory_size=10, batch_size=256, seed=2)
    fill(mem, [(0, 6, True), (100, 6, True), (200, 6, True)])  # 3 x (7 rows + context rows) > 10
    assert mem._size == 10 and mem.total_appended > 10
    kept = {int(mem.get_transition(i)[3][0]) for i in range(len(mem))}
    assert kept and min(kept) > 100  # the oldest episodes were overwritten
    assert max(kept) == 206
    b = mem.sample()
    check_transitions(b.obs.numpy(), b.act.numpy(), b.rew.numpy(), b.next_obs.numpy())
    for i in range(len(mem)):  # per-item access agrees with the vectorised path's rules
        o, _, _, o2, *_ = mem.get_transition(i)
        assert o2[0] == o[0] + 1


def test_oldest_row_never_starts_a_transition_after_wrap() -> None:
    mem = ReplayMemory(memory_size=5, batch_size=64, seed=3)
    builder = BufferBuilder(capacity=30, overlap=1)
    for buf in episode_rows(builder, 0, 20, False):  # one long episode, wrapping several times
        mem.append_buffer(buf)
    b = mem.sample()
    check_transitions(b.obs.numpy(), b.act.numpy(), b.rew.numpy(), b.next_obs.numpy())
    # the 5 newest rows are [17, 18 | context copy of 18, 19, 20]: 17 lost its predecessor, the copy ends nothing
    assert sorted(int(mem.get_transition(i)[3][0]) for i in range(len(mem))) == [18, 19, 20]


def test_tuple_observations() -> None:
    mem = ReplayMemory(memory_size=50, batch_size=8, seed=0)
    n = 6
    buf = Buffer(act=np.ones((n, 2), np.float32), obs=(np.arange(n, dtype=np.float32)[:, None],
                                                       np.zeros((n, 4, 4), np.uint8)),
                 rew=np.ones(n, np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
                 reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64))
    mem.append_buffer(buf)
    b = mem.sample()
    assert isinstance(b.obs, tuple) and b.obs[0].shape == (8, 1) and b.obs[1].shape == (8, 4, 4)
    assert b.obs[1].dtype == torch.uint8
    np.testing.assert_array_equal(b.next_obs[0].numpy(), b.obs[0].numpy() + 1)


def test_empty_memory_explains_itself() -> None:
    with pytest.raises(RuntimeError, match="no complete transition"):
        ReplayMemory(memory_size=10, batch_size=2).sample()


class TutorialMemory(MemoryDataloading):
    """tmrl's tutorial memory, ported with small edits: list storage, per-item get_transition, nothing else."""

    def append_buffer(self, buffer: Buffer) -> None:
        for act, obs, rew, terminated, truncated, info in buffer.memory:
            self.data.append((act, obs, rew, terminated, truncated, info["reset"]))
        self.data = self.data[-self.memory_size:]

    def __len__(self) -> int:
        return max(0, len(self.data) - 1)

    def get_transition(self, item: int):  # type: ignore[no-untyped-def]
        while self.data[item + 1][5]:  # the next row starts an episode: take a neighbour
            item = (item + 1) % len(self)
        _, last_obs, *_ = self.data[item]
        act, new_obs, rew, terminated, truncated, _ = self.data[item + 1]
        return last_obs, act, rew, new_obs, terminated, truncated, {}


def test_custom_memory_with_only_get_transition_works() -> None:
    mem = TutorialMemory(memory_size=1000, batch_size=32, seed=0)
    fill(mem, [(0, 8, True), (100, 8, False)])  # type: ignore[arg-type]
    b = mem.sample()
    assert b.obs.shape == (32, 2) and b.rew.dtype == torch.float32
    check_transitions(b.obs.numpy(), b.act.numpy(), b.rew.numpy(), b.next_obs.numpy())
    assert len(list(iter(mem))) == mem.nb_steps


def test_obs_preprocessor_and_dataset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    mem = ReplayMemory(memory_size=50, batch_size=4, seed=0, obs_preprocessor=lambda o: o * 2)
    fill(mem, [(0, 5, True)])
    b = mem.sample()
    np.testing.assert_array_equal(b.next_obs.numpy()[:, 0], b.obs.numpy()[:, 0] + 2)
    n = 4
    path = tmp_path / "data.npz"
    np.savez(path, act=np.zeros((n, 1), np.float32), obs=np.arange(n, dtype=np.float32)[:, None],
             rew=np.zeros(n, np.float32), terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
             reset=np.arange(n) == 0, context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64))
    loaded = ReplayMemory(memory_size=10, batch_size=2, dataset_path=str(path))
    assert len(loaded) == 3


class SixValueMemory(TutorialMemory):
    """tmrl's older tutorial: ``get_transition`` returns ``(last_obs, new_act, rew, new_obs, done, info)``."""

    def get_transition(self, item: int):  # type: ignore[no-untyped-def]
        last_obs, act, rew, new_obs, terminated, _truncated, info = super().get_transition(item)
        return last_obs, act, rew, new_obs, terminated, info


def test_a_get_transition_with_tmrls_old_six_values_says_what_to_return() -> None:
    mem = SixValueMemory(memory_size=1000, batch_size=4, seed=0)
    fill(mem, [(0, 8, True)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"SixValueMemory\.get_transition must return 7 values, \(last_obs, new_act, "
                                        r"rew, new_obs, terminated, truncated, info\); it returned 6\. .*done"):
        mem.sample()


# -- dataset_path: netrl reads save_dataset's .npz files; tmrl's folders and pickles get an error saying so -------

def dataset_rows(n: int = 6) -> Buffer:
    """One episode of ``n`` rows with tuple observations: obs[0] = [t], act = rew = t."""
    t = np.arange(n, dtype=np.float32)
    return Buffer(act=t[:, None].copy(), obs=(t[:, None].copy(), np.zeros((n, 2, 2), np.uint8)), rew=t.copy(),
                  terminated=np.arange(n) == n - 1, truncated=np.zeros(n, bool), reset=np.arange(n) == 0,
                  context=np.zeros(n, bool), policy_version=np.full(n, 3, np.int64))


def test_save_dataset_round_trips_through_dataset_path(tmp_path: Path) -> None:
    buf = dataset_rows()
    save_dataset(tmp_path / "run1", buf)  # numpy adds .npz
    loaded = ReplayMemory(memory_size=20, batch_size=8, seed=0, dataset_path=str(tmp_path / "run1.npz"))
    direct = ReplayMemory(memory_size=20, batch_size=8, seed=0)
    direct.append_buffer(buf)
    assert len(loaded) == len(direct) == 5
    for i in range(len(direct)):
        a, b = loaded.get_transition(i), direct.get_transition(i)
        np.testing.assert_array_equal(a[0][0], b[0][0])
        np.testing.assert_array_equal(a[1], b[1])
        assert a[2:3] + a[4:] == b[2:3] + b[4:]
    assert loaded.get_transition(4)[4:6] == (True, False)


def test_save_dataset_refuses_observations_it_could_not_read_back(tmp_path: Path) -> None:
    buf = dataset_rows()
    buf.obs = {"pos": buf.obs[0]}
    with pytest.raises(ValueError, match=r"save_dataset stores obs as one array or a flat tuple of arrays.*"
                                         r"flatten it into a tuple first"):
        save_dataset(tmp_path / "d.npz", buf)
    assert not (tmp_path / "d.npz").exists()


DATASET_ADVICE = (r"netrl reads one \.npz file of sample columns, as written by netrl\.memory\.save_dataset; it does "
                  r"not read tmrl's pickled data\.pkl datasets, because netrl never unpickles")


def test_a_missing_dataset_path_names_it_and_the_empty_memory_alternative(tmp_path: Path) -> None:
    path = tmp_path / "nothing_here"
    with pytest.raises(FileNotFoundError, match=rf"dataset_path '{re.escape(str(path))}' does not exist \(pass "
                                                rf"dataset_path=\"\" to start with an empty memory, as tmrl does.*\)\. "
                                                rf"{DATASET_ADVICE}"):
        ReplayMemory(memory_size=10, dataset_path=str(path))


def test_a_missing_dataset_path_points_at_the_npz_numpy_wrote(tmp_path: Path) -> None:
    save_dataset(tmp_path / "run1", dataset_rows())
    written = re.escape(str(tmp_path / "run1.npz"))
    with pytest.raises(FileNotFoundError, match=rf"does not exist \(did you mean '{written}'\? "):
        ReplayMemory(memory_size=10, dataset_path=str(tmp_path / "run1"))


def test_a_tmrl_dataset_folder_is_refused_with_what_netrl_reads(tmp_path: Path) -> None:
    (tmp_path / "data.pkl").write_bytes(pickle.dumps([]))
    with pytest.raises(ValueError, match=rf"dataset_path '{re.escape(str(tmp_path))}' is a folder holding tmrl's "
                                         rf"data\.pkl, not a file\. {DATASET_ADVICE}"):
        ReplayMemory(memory_size=10, dataset_path=str(tmp_path))
    with pytest.raises(ValueError, match=rf"'{re.escape(str(tmp_path / 'sub'))}' is a folder, not a file"):
        (tmp_path / "sub").mkdir()
        ReplayMemory(memory_size=10, dataset_path=str(tmp_path / "sub"))


def _unpickled() -> None:
    raise AssertionError("netrl unpickled a dataset")


class Unpicklable:
    """Pickles fine; unpickling it fails the test."""

    def __reduce__(self) -> Any:
        return _unpickled, ()


@pytest.mark.parametrize(("name", "write", "problem"), [
    ("data.pkl", lambda p: p.write_bytes(pickle.dumps([(0, 1, 2.0, False, {})] * 3)),
     r"is not an \.npz archive of arrays \(it is a pickle, such as tmrl's data\.pkl, or another format\)"),
    ("notes.npz", lambda p: p.write_text("hello"), r"is not an \.npz archive of arrays \(it is a pickle, .*\)"),
    ("empty.npz", lambda p: p.write_bytes(b""), r"is not a readable \.npz archive \(No data left in file\)"),
    ("torn.npz", lambda p: p.write_bytes(b"PK\x03\x04torn"),
     r"is not a readable \.npz archive \(File is not a zip file\)"),
    ("one.npy", lambda p: np.save(p, np.zeros(3)), r"holds a single \.npy array, not an \.npz archive of columns"),
    ("objects.npz", lambda p: np.savez(p, rew=np.array([Unpicklable()], dtype=object)),
     r"has a column of Python objects \(pickled data\)"),
    ("partial.npz", lambda p: np.savez(p, obs=np.zeros((2, 1)), rew=np.zeros(2)),
     r"lacks the columns terminated, truncated, reset, context, policy_version, act \(or act/0, act/1\.\.\.\)"),
])
def test_a_dataset_that_is_not_netrls_npz_says_what_netrl_reads(tmp_path: Path, name: str, write: Any,
                                                                 problem: str) -> None:
    path = tmp_path / name
    write(path)
    expected = rf"^dataset_path '{re.escape(str(path))}' {problem}\. {DATASET_ADVICE}"
    with pytest.raises(ValueError, match=expected) as err:
        ReplayMemory(memory_size=10, dataset_path=str(path))
    assert "allow_pickle" not in str(err.value)


def test_a_tmrl_style_memory_gets_the_same_dataset_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=DATASET_ADVICE):
        TutorialMemory(memory_size=10, dataset_path=str(tmp_path / "missing"))


# -- sample_preprocessor: netrl's six arguments are checked when the memory is built ------------------------------

def preprocess6(o: Any, a: Any, r: Any, o2: Any, term: Any, trunc: Any) -> tuple[Any, ...]:
    return o, a, r * 2, o2, term, trunc


def scaled(o: Any, a: Any, r: Any, o2: Any, term: Any, trunc: Any, *, scale: float) -> tuple[Any, ...]:
    return o, a, r * scale, o2, term, trunc


class Preprocessor:
    def __call__(self, o: Any, a: Any, r: Any, o2: Any, term: Any, trunc: Any) -> tuple[Any, ...]:
        return o, a, r * 2, o2, term, trunc


def star(*sample: Any) -> tuple[Any, ...]:
    o, a, r, o2, term, trunc = sample
    return o, a, r * 2, o2, term, trunc


@pytest.mark.parametrize("fn", [preprocess6, functools.partial(scaled, scale=2.0),
                                lambda o, a, r, o2, term, trunc: (o, a, r * 2, o2, term, trunc), Preprocessor(),
                                star],
                         ids=["function", "partial", "lambda", "callable-object", "star-args"])
@pytest.mark.parametrize("memory_cls", [ReplayMemory, TutorialMemory])
def test_a_six_argument_sample_preprocessor_is_accepted_and_applied(memory_cls: Any, fn: Any) -> None:
    mem = memory_cls(memory_size=100, batch_size=16, seed=0, sample_preprocessor=fn)
    fill(mem, [(0, 10, True)])
    b = mem.sample()
    np.testing.assert_array_equal(b.rew.numpy(), b.next_obs.numpy()[:, 0] * 2)


def test_a_sample_preprocessor_without_a_readable_signature_is_accepted() -> None:
    ReplayMemory(memory_size=10, sample_preprocessor=max)  # a builtin: the first sample() would tell


def old_preprocessor(obs: Any, act: Any, rew: Any, next_obs: Any, done: Any) -> tuple[Any, ...]:
    return obs, act, rew, next_obs, done


class OldPreprocessor:
    def __call__(self, obs: Any, act: Any, rew: Any, next_obs: Any, done: Any) -> tuple[Any, ...]:
        return obs, act, rew, next_obs, done


@pytest.mark.parametrize(("fn", "name"), [(old_preprocessor, "'old_preprocessor'"),
                                          (lambda o, a, r, o2, d: (o, a, r, o2, d), "'<lambda>'"),
                                          (OldPreprocessor(), r"<.*OldPreprocessor object at .*>")])
@pytest.mark.parametrize("memory_cls", [ReplayMemory, TutorialMemory])
def test_tmrls_five_argument_sample_preprocessor_is_refused_when_the_memory_is_built(memory_cls: Any, fn: Any,
                                                                                    name: str) -> None:
    with pytest.raises(TypeError, match=rf"^sample_preprocessor {name} must take 6 arguments, \(obs, act, rew, "
                                        r"next_obs, terminated, truncated\), and return them in that order\. tmrl's "
                                        r"older 5-argument form, \(obs, act, rew, next_obs, done\), must split done "
                                        r"into terminated \(the episode ended\) and truncated"):
        memory_cls(memory_size=10, sample_preprocessor=fn)


def test_a_sample_preprocessor_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match=r"sample_preprocessor must be a function or None \(got str\)"):
        ReplayMemory(memory_size=10, sample_preprocessor="augment")  # type: ignore[arg-type]
