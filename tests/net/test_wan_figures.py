"""The wan benchmark's figures from the roles' logs (benchmarks/wan.py): a worker the server lost
during the run is counted, one whose goodbye was lost on the emulated path at the stop is not."""

from __future__ import annotations

from datetime import datetime

from benchmarks.wan import count_before

# as a server logs them: at 19:54:40 during the run, and at 19:55:02, after the stop began at
# 19:55:01.5 (the worker's BYE lost on the lossy path: the server saw its connection close)
SERVER_LOG = """\
19:53:43.092 I [server 1] netrl.server.admission: worker 'far' (198.18.0.2) connected (netrl 0.1.0)
19:54:40.001 I [server 1] netrl.server.membership: worker 'far' (198.18.0.2) lost (silent for 3.0 s)
19:54:41.500 I [server 1] netrl.server.admission: worker 'far' (198.18.0.2) connected (netrl 0.1.0)
19:55:02.194 I [server 1] netrl.server.membership: worker 'far' (198.18.0.2) lost (its connection closed)
"""
DAY = "2026-12-07"


def test_a_worker_lost_at_the_stop_is_no_reconnect_of_the_run() -> None:
    stop = datetime.strptime(f"{DAY} 19:55:01.500", "%Y-%m-%d %H:%M:%S.%f").timestamp()
    assert count_before(SERVER_LOG, r"worker 'far' .* lost", DAY, stop) == 1
    later = datetime.strptime(f"{DAY} 19:56:00.000", "%Y-%m-%d %H:%M:%S.%f").timestamp()
    assert count_before(SERVER_LOG, r"worker 'far' .* lost", DAY, later) == 2
