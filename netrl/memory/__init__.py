"""Replay memories: tmrl's :class:`MemoryDataloading` contract, the default :class:`ReplayMemory`,
memories that assemble each row's input from earlier rows by declared views (:class:`View`:
:func:`prev_actions`, :func:`prev_rewards`, :func:`last_observations`) on :class:`HistoryMemory`
(:class:`FrameStackMemory`, :class:`ActionBufferMemory`), the worker-side compressors that drop what
they rebuild, and ``.npz`` datasets.

The RL half: nothing here imports the network (zmq, msgpack, the protocol or the roles).
"""

from netrl.memory.action_buffer import ActionBufferCompressor, ActionBufferMemory
from netrl.memory.base import MemoryDataloading
from netrl.memory.dataset import read_dataset, save_dataset
from netrl.memory.frames import FrameStackCompressor, FrameStackMemory
from netrl.memory.history import HistoryMemory
from netrl.memory.replay import ReplayMemory
from netrl.memory.views import View, last_observations, prev_actions, prev_rewards

__all__ = ["ActionBufferCompressor", "ActionBufferMemory", "FrameStackCompressor", "FrameStackMemory",
           "HistoryMemory", "MemoryDataloading", "ReplayMemory", "View", "last_observations", "prev_actions",
           "prev_rewards", "read_dataset", "save_dataset"]
