"""RolloutWorker on its own: what it refuses before anything reaches the network."""

from __future__ import annotations

import pytest

from netrl.agents.sac import MLPActor
from netrl.config import NetworkConfig
from netrl.envs import GenericGymEnv
from netrl.errors import ConfigError
from netrl.launch import free_port
from netrl.util import partial
from netrl.wire import BUNDLE_HEADER_ROOM
from netrl.worker import RolloutWorker


def test_a_packet_bigger_than_the_server_can_relay_stops_the_worker_with_what_to_change() -> None:
    net = NetworkConfig(max_message_bytes=1 << 16, heartbeat_interval_s=0.2)
    # 2,000 Pendulum rows take about 60 KB: under max_message_bytes, but over it less the bundle header's room
    worker = RolloutWorker(partial(GenericGymEnv, id="Pendulum-v1"), partial(MLPActor, hidden_sizes=(8,)),
                           min_samples_per_worker_packet=2000, max_packet_delay_s=600.0, compression="none",
                           server_ip="127.0.0.1", server_port=free_port(), network=net, worker_id="w", seed=0)
    with pytest.raises(ConfigError) as err:
        worker.run(nb_episodes=20)  # closes the worker however it ends
    text = str(err.value)
    assert "worker w: a packet of 2000 samples takes" in text and f"less {BUNDLE_HEADER_ROOM}" in text
    assert "worker.min_samples_per_worker_packet (2000)" in text and "network.max_message_bytes = 65536" in text
    assert worker.seq == 1  # the first packet stopped it
