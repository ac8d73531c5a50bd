"""Replay memory: wraparound, episode boundaries, shapes and dtypes, datasets, and tmrl-style custom memories."""

from __future__ import annotations

import functools
import inspect
import logging
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from netrl.errors import ConfigError
from netrl.memory.action_buffer import ActionBufferMemory
from netrl.memory.base import MemoryDataloading
from netrl.memory.dataset import save_dataset
from netrl.memory.frames import FrameStackMemory
from netrl.memory.replay import ReplayMemory
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
    with pytest.raises(ValueError, match="no signature found"):  # a builtin: its arguments cannot be checked
        inspect.signature(max)
    mem = ReplayMemory(memory_size=100, batch_size=16, seed=0, sample_preprocessor=max)  # accepted when built
    assert mem.sample_preprocessor is max
    fill(mem, [(0, 10, True)])
    with pytest.raises(ValueError, match="truth value of an array"):  # kept and called: the first sample() tells
        mem.sample()


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


# -- bad input: a packet that does not fit is refused whole, with the column, what it has and what is stored -------

def packet(n: int = 4, obs: Any = None, act: Any = None, weight: Any = None, base: float = 0.0) -> Buffer:
    """One episode of ``n`` rows: obs = [t, t, t], act = [t, t] with t = base + row (float32), unless given."""
    t = np.arange(n, dtype=np.float32) + np.float32(base)
    return Buffer(act=np.repeat(t[:, None], 2, 1) if act is None else act,
                  obs=np.repeat(t[:, None], 3, 1) if obs is None else obs, rew=t.copy(),
                  terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), reset=np.arange(n) == 0,
                  context=np.zeros(n, bool), policy_version=np.zeros(n, np.int64), weight=weight)


def stored_transitions(mem: MemoryDataloading) -> list[tuple[Any, ...]]:
    return [(mem.get_transition(i)[1].tolist(), mem.get_transition(i)[3].tolist()) for i in range(len(mem))]


def test_a_refused_packet_leaves_the_replay_memory_as_it_was() -> None:
    mem = ReplayMemory(memory_size=10, batch_size=4, seed=0)
    mem.append_buffer(packet(10))
    before, size, pos, total = stored_transitions(mem), mem._size, mem._pos, mem.total_appended
    cols = {k: v.copy() for k, v in mem._cols.items()}
    bad = packet(4, obs=np.zeros((4, 4), np.float32), base=100, weight=np.full(4, 0.5, np.float32))
    with pytest.raises(ValueError, match=r"column 'obs' has shape \(4,\) per row"):
        mem.append_buffer(bad)  # 4 values per row where the memory stores 3: nothing of it may be written
    assert (len(mem), mem._size, mem._pos, mem.total_appended) == (9, size, pos, total)
    assert stored_transitions(mem) == before
    for k, v in cols.items():
        np.testing.assert_array_equal(mem._cols[k], v, err_msg=k)
    assert mem.sample().weight is None  # the refused packet's loss weights did not switch weighting on


def test_a_refused_packet_leaves_a_frame_stack_memory_as_it_was() -> None:
    mem = FrameStackMemory(stack=2, memory_size=20, batch_size=4, seed=0)
    mem.append_buffer(packet(6, obs=np.zeros((6, 2, 2), np.uint8)))
    with pytest.raises(ValueError, match=r"column 'frame' has shape \(3, 3\) per row"):
        mem.append_buffer(packet(6, obs=np.zeros((6, 3, 3), np.uint8), weight=np.full(6, 0.5, np.float32)))
    assert len(mem) == 5 and mem.sample().weight is None


def test_a_refused_packet_leaves_an_action_buffer_memory_able_to_sample() -> None:
    def actbuf_packet(core: int) -> Buffer:
        return packet(6, obs=(*(np.zeros((6, 1), np.float32) for _ in range(core)), np.zeros(6, np.uint8)))

    mem = ActionBufferMemory(act_buf_len=1, memory_size=20, batch_size=4, seed=0)
    mem.append_buffer(actbuf_packet(1))
    with pytest.raises(ValueError, match="structure differs from the memory's"):
        mem.append_buffer(actbuf_packet(2))  # one more core leaf than the memory stores
    assert len(mem.sample().obs) == 2  # the core leaf and the rebuilt action buffer, as before the refusal


@pytest.mark.parametrize(("first", "second", "error"), [
    (packet(3), packet(3, obs=np.full((3, 1), 7, np.float32)),
     r"column 'obs' has shape \(1,\) per row \(shape \(3, 1\)\); the memory stores \(3,\) per row"),
    (packet(3), packet(3, obs=np.array([5, 6, 7], np.float32)),
     r"column 'obs' has shape \(\) per row \(shape \(3,\)\); the memory stores \(3,\) per row"),
    (packet(3), packet(3, act=np.full((3, 1), 9, np.float32)),
     r"column 'act' has shape \(1,\) per row \(shape \(3, 1\)\); the memory stores \(2,\) per row"),
    (packet(3, obs=np.ones((3, 3), np.uint8)), packet(3, obs=np.full((3, 3), 0.7)),
     r"column 'obs' has dtype float64; the memory stores uint8"),
    (packet(3, obs=(np.ones((3, 3), np.float32), np.ones((3, 2), np.uint8))),
     packet(3, obs=(np.ones((3, 3), np.float32), np.ones((3, 2), np.float32))),
     r"column 'obs/1' has dtype float32; the memory stores uint8"),
    (packet(3), packet(3, obs=np.ones((5, 3), np.float32)),
     r"column 'obs' has shape \(5, 3\), not one row per sample of this 3-row packet"),
], ids=["obs-(1,)-into-(3,)", "obs-scalar-per-row", "act-(1,)-into-(2,)", "float-into-uint8", "tuple-leaf-dtype",
        "rows-differ"])
def test_the_replay_memory_refuses_shapes_and_dtypes_numpy_would_broadcast_or_cast(first: Buffer, second: Buffer,
                                                                                   error: str) -> None:
    mem = ReplayMemory(memory_size=100, batch_size=4, seed=0)
    mem.append_buffer(first)
    with pytest.raises(ValueError, match=error):
        mem.append_buffer(second)
    assert len(mem) == 2


def test_dtypes_of_the_same_kind_are_accepted() -> None:
    mem = ReplayMemory(memory_size=100, batch_size=4, seed=0)
    mem.append_buffer(packet(3))
    mem.append_buffer(packet(3, obs=np.full((3, 3), 0.5), act=np.full((3, 2), 0.5)))  # float64 into float32
    assert len(mem) == 4 and mem.get_transition(3)[3].dtype == np.float32
    frames = FrameStackMemory(stack=2, memory_size=100, batch_size=4, seed=0)
    frames.append_buffer(packet(3, obs=np.zeros((3, 2, 2), np.uint8), act=np.zeros((3, 1), np.int64)))
    frames.append_buffer(packet(3, obs=np.zeros((3, 2, 2), np.uint8), act=np.zeros((3, 1), np.int32)))
    with pytest.raises(ValueError, match=r"column 'act' has dtype float32; the memory stores int64"):
        frames.append_buffer(packet(3, obs=np.zeros((3, 2, 2), np.uint8), act=np.full((3, 1), 0.7, np.float32)))
    assert len(frames) == 4


def test_a_float64_dataset_is_stored_as_float32_and_float32_packets_still_fit(tmp_path: Path) -> None:
    n = 6
    rows = packet(n, obs=np.array([[0.1 * i, 0.2, 0.3] for i in range(n)]), act=np.array([[0.5]] * n))  # float64
    save_dataset(tmp_path / "floats.npz", rows)
    mem = ReplayMemory(memory_size=100, batch_size=8, seed=0, dataset_path=str(tmp_path / "floats.npz"))
    mem.append_buffer(packet(n, obs=np.ones((n, 3), np.float32), act=np.full((n, 1), 0.25, np.float32)))
    assert len(mem) == 2 * (n - 1)
    b = mem.sample()
    assert b.obs.dtype == b.next_obs.dtype == b.act.dtype == torch.float32


# -- sample_preprocessor gets read-only arrays: obs and next_obs of a frame stack share frames ---------------------

def zero_obs_in_place(o: Any, a: Any, r: Any, o2: Any, term: Any, trunc: Any) -> tuple[Any, ...]:
    o[:] = 0
    return o, a, r, o2, term, trunc


def frame_packet(n: int = 12) -> Buffer:
    return packet(n, obs=np.stack([np.full((2, 2), 10 * (i + 1), np.uint8) for i in range(n)]),
                  act=np.arange(n, dtype=np.float32)[:, None])


@pytest.mark.parametrize("memory_cls", [functools.partial(FrameStackMemory, stack=4), ReplayMemory])
def test_a_sample_preprocessor_cannot_change_the_batch_in_place(memory_cls: Any) -> None:
    mem = memory_cls(memory_size=100, batch_size=3, seed=0, sample_preprocessor=zero_obs_in_place)
    mem.append_buffer(frame_packet())
    with pytest.raises(ValueError, match="read-only"):
        mem.sample()


def identity(o: Any, a: Any, r: Any, o2: Any, term: Any, trunc: Any) -> tuple[Any, ...]:
    return o, a, r, o2, term, trunc


def derived_views(o: Any, a: Any, r: Any, o2: Any, term: Any, trunc: Any) -> tuple[Any, ...]:
    return o[:], a, r, o2[...], term, trunc


def new_arrays(o: Any, a: Any, r: Any, o2: Any, term: Any, trunc: Any) -> tuple[Any, ...]:
    return np.zeros_like(o), a, r, o2, term, trunc


@pytest.mark.parametrize("fn", [identity, derived_views, new_arrays])
@pytest.mark.parametrize("memory_cls", [functools.partial(FrameStackMemory, stack=4), ReplayMemory])
def test_what_a_sample_preprocessor_returns_reaches_torch_without_warnings(memory_cls: Any, fn: Any) -> None:
    mem = memory_cls(memory_size=100, batch_size=8, seed=0, sample_preprocessor=fn)
    mem.append_buffer(frame_packet())
    for _ in range(3):  # the reused buffers must stay writeable from one batch to the next
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch.from_numpy warns about read-only arrays
            b = mem.sample()
        k = b.act[:, 0].numpy().astype(int)
        newest = b.next_obs[:, -1, 0, 0] if b.next_obs.dim() == 4 else b.next_obs[:, 0, 0]
        np.testing.assert_array_equal(newest.numpy(), 10 * (k + 1))
        if fn is not new_arrays:
            previous = b.obs[:, -1, 0, 0] if b.obs.dim() == 4 else b.obs[:, 0, 0]
            np.testing.assert_array_equal(previous.numpy(), 10 * k)
        if fn is identity and b.obs.dim() == 4:  # still one gathered window of frames, not a copy per side
            assert b.next_obs.data_ptr() - b.obs.data_ptr() == b.obs[0, 0].nbytes  # next_obs: one frame further


# -- per-item access and edges -----------------------------------------------------------------------------------

def test_get_transition_returns_copies_that_later_packets_leave_alone() -> None:
    mem = ReplayMemory(memory_size=8, batch_size=4, seed=0)
    mem.append_buffer(packet(8))
    o, a, _, o2, *_ = mem.get_transition(0)
    mem.append_buffer(packet(8, base=100))  # overwrites every row of the ring
    assert (o.tolist(), a.tolist(), o2.tolist()) == ([0.0] * 3, [1.0] * 2, [1.0] * 3)


@pytest.mark.parametrize("memory_cls", [ReplayMemory, FrameStackMemory, TutorialMemory])
@pytest.mark.parametrize(("kwargs", "error"), [({"memory_size": 0}, r"memory_size must be > 0 \(got 0\)"),
                                               ({"memory_size": -5}, r"memory_size must be > 0 \(got -5\)"),
                                               ({"batch_size": 0}, r"batch_size must be > 0 \(got 0\)"),
                                               ({"memory_size": 0, "batch_size": -1},
                                                r"memory_size must be > 0 \(got 0\); batch_size must be > 0")])
def test_sizes_that_are_not_positive_are_refused_by_name(memory_cls: Any, kwargs: dict[str, int], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        memory_cls(**{"memory_size": 10, **kwargs})


@pytest.mark.parametrize("size", [10**14, 10**18])  # more than any machine holds; past numpy's largest array
@pytest.mark.parametrize("memory_cls", [ReplayMemory, functools.partial(FrameStackMemory, stack=2)])
def test_a_memory_size_the_machine_cannot_hold_is_a_config_error_naming_the_key(memory_cls: Any, size: int) -> None:
    # It allocates at the first packet, after the trainer connects: unchecked, it would die there with numpy's
    # traceback.
    mem = memory_cls(memory_size=size)
    image = isinstance(mem, FrameStackMemory)
    with pytest.raises(ConfigError, match=rf"memory.memory_size is {size}: the replay memory needs [\d,.]+ GiB for it "
                                          rf"\({68 if image else 74} bytes per row\).*lower memory.memory_size"):
        mem.append_buffer(packet(4, obs=np.zeros((4, 2, 2), np.uint8)) if image else packet(4))
    assert len(mem) == 0


def test_a_memory_size_over_the_memory_available_is_warned_of_at_allocation(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # numpy gets the pages lazily: a ring larger than the RAM allocates fine, and the system kills the trainer
    # without a word once the memory fills.
    import types

    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=74 * 1000))
    with caplog.at_level(logging.WARNING, logger="netrl.memory.base"):
        ReplayMemory(memory_size=999).append_buffer(packet(4))  # 74 bytes per row (28 of them the
        # trajectory links): 73,926 bytes fit
        assert not caplog.records
        ReplayMemory(memory_size=2000).append_buffer(packet(4))
    assert len(caplog.records) == 1 and "memory.memory_size 2000 needs" in caplog.text
    assert "lower memory.memory_size to about 1000 rows" in caplog.text


@pytest.mark.parametrize(("rows", "item", "held"), [(0, 0, 0), (4, 3, 3), (4, -1, 3)])
@pytest.mark.parametrize("memory_cls", [ReplayMemory, functools.partial(FrameStackMemory, stack=2)])
def test_get_transition_out_of_range_names_the_index_and_the_length(memory_cls: Any, rows: int, item: int,
                                                                    held: int) -> None:
    mem = memory_cls(memory_size=10)
    if rows:
        mem.append_buffer(packet(rows, obs=np.zeros((rows, 2, 2), np.uint8)) if isinstance(mem, FrameStackMemory)
                          else packet(rows))
    assert len(mem) == held
    with pytest.raises(IndexError, match=rf"transition index {item} is out of range: the memory holds {held} "
                                         r"transitions \(0 <= item < len\(memory\)\)"):
        mem.get_transition(item)


@pytest.mark.parametrize("memory_cls", [ReplayMemory, functools.partial(FrameStackMemory, stack=2)])
def test_a_memory_of_mostly_stale_rows_samples_without_drawing_rows_per_transition_times_the_batch(
        memory_cls: Any) -> None:
    # Rejection sampling would draw batch * rows / transitions random rows: with 3 of 100,000 rows ending a
    # transition (the rest stale, weight 0), one sample() would take 0.8 s and 290 MB.
    n = 100_000
    weight = np.zeros(n, np.float32)
    weight[[10, 5_000, n - 1]] = 1.0
    memory = memory_cls(memory_size=n, batch_size=64, seed=0)
    memory.append_buffer(packet(n, obs=np.zeros((n, 2, 2), np.uint8), act=np.arange(n, dtype=np.float32)[:, None],
                                weight=weight))
    assert len(memory) == 3
    drawn: list[int] = []

    class Counted:  # the memory's generator, counting the random rows drawn
        def __init__(self, rng: np.random.Generator) -> None:
            self.rng = rng

        def integers(self, *args: Any, size: int, **kwargs: Any) -> Any:
            drawn.append(size)
            return self.rng.integers(*args, size=size, **kwargs)

    memory.rng = Counted(memory.rng)
    acts = {float(a) for _ in range(5) for a in memory.sample().act[:, 0]}
    assert acts == {10.0, 5_000.0, n - 1.0} and sum(drawn) == 5 * 64  # every transition, and one draw per item
