"""Replay memories: tmrl's :class:`MemoryDataloading` contract, the default :class:`ReplayMemory`, memories that
rebuild observations from earlier rows (:class:`FrameStackMemory`, :class:`ActionBufferMemory`, on
:class:`HistoryMemory`) with the worker-side compressors that drop what they rebuild, and ``.npz`` datasets.

The RL half: nothing here imports the network (zmq, msgpack, the protocol or the roles).
"""

from netrl.memory.action_buffer import ActionBufferCompressor, ActionBufferMemory
from netrl.memory.base import MemoryDataloading
from netrl.memory.dataset import read_dataset, save_dataset
from netrl.memory.frames import FrameStackCompressor, FrameStackMemory
from netrl.memory.history import HistoryMemory
from netrl.memory.replay import ReplayMemory

__all__ = ["ActionBufferCompressor", "ActionBufferMemory", "FrameStackCompressor", "FrameStackMemory",
           "HistoryMemory", "MemoryDataloading", "ReplayMemory", "read_dataset", "save_dataset"]
