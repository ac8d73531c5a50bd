"""Weights over a slow link: the time from the trainer's publish to the version loaded on a worker whose only way to
the server is an emulated wide-area link, for each weight format, and the worker's version lag meanwhile.

The pieces are netrl's own, each in a process of its own: the server (``python -m netrl --server``, CURVE on, every
setting at its default); a trainer process holding a real TrainerLink that publishes an MLP actor (observation 64 ->
960 -> 960 -> mean and log-std of 8 actions: 1,000,336 parameters, see ``--hidden``) every ``--interval`` s, and
between two publications trains it for real (``--steps`` Adam steps, lr 3e-4, on a synthetic regression loss), so
consecutive versions differ as in training and deltas are measured on real changes; and a RolloutWorker (a still env
with those spaces, never stepped) whose network thread checks each version and loads it into a spare actor. The
worker reaches the server's worker port only through :class:`benchmarks.wan_link.WanLink` (10 Mbit/s, 100 ms round
trip, 1% loss by default), which runs in a thread of this process, so its CPU is apart from the roles' (reported).

What the forwarder models and what it does not (its docstring has the details): a token bucket per direction at the
bandwidth, half the round trip each way, a lost segment arriving one retransmission timeout later with everything
behind it waiting (head-of-line blocking, as TCP shows loss to the application), and a 4 MiB buffer on the path. It
does not shrink a congestion window after a loss, reorder, duplicate or corrupt segments, share the link with other
traffic, or model slow start: on a real lossy path of this kind TCP's throughput is lower (one stream keeps about
``MSS / RTT * 1.22 / sqrt(loss)``: 1.4 Mbit/s at 100 ms and 1%), so the times here are lower bounds, the more so
for formats that send more bytes.

Reported per format (``--formats``): versions published and applied (a version published while another is on its
way waits, and a newer one replaces it: only the newest is sent), the time from ``publish()`` to the version loaded
on the worker (the receiver's ``loaded_at``; both sides read ``time.time()`` on this one machine) for the first
version (a delta format's first one is full) and median and p90 of the others, the version lag (the trainer's newest
published version minus the worker's newest loaded one, on a 100 ms grid over the measured window, computed from
those two event logs: median, max, and the max in each half of the window: a bounded lag is no higher in the
second half), bytes the link carried from server to worker per applied version (heartbeats included), TCP
connections through the link (1: the worker never reconnected), and the forwarder's CPU time.

Baseline, "raw ZeroMQ, one hop": the same float32 bytes with no netrl code, PAIR to PAIR (CURVE on) through a
WanLink with the same settings, on the same schedule and with the same rule (one version in flight, the newest
published waits; the receiver's arrival time comes back on the same link).

Usage: .venv/bin/python scripts/bench_weights_link.py [--formats float32,float16,bfloat16,int8,delta,auto]
           [--seconds 30] [--quick] [--interval 0.5] [--bandwidth-mbit 10] [--rtt-ms 100] [--loss 0.01]
           [--json bench_weights_link.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("WANDB_MODE", "disabled")

import numpy as np
import zmq
from benchmarks.common import report_loaded
from benchmarks.wan_link import WanLink

from netrl.config.load import config_to_dict
from netrl.config.sections import Config, NetworkConfig
from netrl.launch import free_port, spawn_role, stop_processes, write_config
from netrl.net.keys import keygen

OBS, ACT = 64, 8
FORMATS = "float32,float16,bfloat16,int8,delta,auto"
GRACE_S = 30.0  # after the last publication: how long the newest version may take to arrive


# -- the children ----------------------------------------------------------------------------------------------------
def _spaces() -> tuple[Any, Any]:
    import gymnasium

    return (gymnasium.spaces.Box(-1, 1, (OBS,), np.float32), gymnasium.spaces.Box(-1, 1, (ACT,), np.float32))


def _actor(hidden: int) -> Any:
    from netrl.agents.sac import MLPActor

    return MLPActor(*_spaces(), hidden_sizes=(hidden, hidden))


def child_trainer(cfg_path: str, hidden: str, fmt: str, budget_s: str, interval: str, seconds: str, steps: str
                  ) -> None:
    """A real TrainerLink publishing a trained actor every ``interval`` s for ``seconds`` s (after the parent's go),
    then keeping the link open until the parent stops it."""
    import torch

    from netrl.config.load import load_config
    from netrl.net.keys import client_keys
    from netrl.net.transport import new_session
    from netrl.trainer.delivery import Deliveries
    from netrl.trainer.trainer import TrainerLink

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = load_config(cfg_path)
    keys = client_keys(cfg.keys_dir, "trainer", "trainer") if cfg.security == "curve" else None
    # only formats other than float32 name one: main knows only float32 until the formats land (issue 34)
    formats = {} if fmt == "float32" else {"weight_format": fmt, "weight_budget_s": float(budget_s)}
    link = TrainerLink(cfg.network, "trainer", new_session(), cfg.network.trainer_port, 8, Deliveries(), None,
                       None, keys, **formats)
    link.start()
    actor = _actor(int(hidden))
    optim = torch.optim.Adam(actor.parameters(), lr=3e-4)
    teacher = torch.randn(OBS, ACT) / OBS ** 0.5  # a fixed target policy to regress on
    while not link.link.ready:
        time.sleep(0.01)
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()  # the parent says go once the worker is connected
    start = time.time()
    version = trained = 0
    step_s: list[float] = []
    loss: torch.Tensor | None = None
    while (due := start + version * float(interval)) < start + float(seconds):  # as many as the raw row publishes
        time.sleep(max(0.0, due - time.time()))
        if version:  # the first version is the initial actor
            t = time.perf_counter()
            for _ in range(int(steps)):
                obs = torch.rand(64, OBS) * 2 - 1
                act, _ = actor(obs, test=True, with_logprob=False)
                loss = ((act - torch.tanh(obs @ teacher)) ** 2).mean()
                optim.zero_grad()
                loss.backward()
                optim.step()
                trained += 1
            step_s.append(time.perf_counter() - t)
        version += 1
        t0 = time.time()
        link.publish(actor, version, trained)
        print(json.dumps({"v": version, "t0": t0, "loss": None if loss is None else loss.item()}), flush=True)
    print(json.dumps({"done": True, "train_s_median": statistics.median(step_s) if step_s else None}), flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        sys.stdin.readline()  # the parent says stop once the worker has the newest version (or gave up waiting)
    link.halt(2.0)


class _StillEnv:
    """The worker's env: the actor's spaces, never stepped (the worker here only receives weights)."""

    def __init__(self) -> None:
        self.observation_space, self.action_space = _spaces()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return np.zeros(OBS, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return np.zeros(OBS, np.float32), 0.0, False, False, {}

    def close(self) -> None:
        pass


def child_worker(cfg_path: str, hidden: str, port: str) -> None:
    """A real RolloutWorker connected through the link (``port``), printing when each weight version is loaded."""
    import torch

    from netrl.agents.sac import MLPActor
    from netrl.config.load import load_config
    from netrl.net.keys import client_keys
    from netrl.util import partial
    from netrl.worker.worker import RolloutWorker

    torch.set_num_threads(1)
    cfg = load_config(cfg_path)
    keys = client_keys(cfg.keys_dir, "worker", "far") if cfg.security == "curve" else None
    worker = RolloutWorker(_StillEnv, partial(MLPActor, hidden_sizes=(int(hidden), int(hidden))),
                           server_ip="127.0.0.1", server_port=int(port), worker_id="far", network=cfg.network,
                           keys=keys, run_dir=None)  # no weights file: the figure is the time to a loaded actor
    worker.start()
    assert worker.net is not None and worker.weights is not None
    while not worker.net.link.ready:
        time.sleep(0.01)
    report_loaded(worker, 0.01)  # polling faster only loads the machine


# -- the parent ------------------------------------------------------------------------------------------------------
def _spawn(*args: str, stdin: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE if stdin else None,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)


def _read(p: subprocess.Popen[str], into: list[dict[str, Any]]) -> None:
    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("{"):
                into.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()


def _wait(what: str, until: Any, timeout: float, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        exited = [p.args[2] for p in procs if p.poll() is not None]  # "_trainer" or "_worker"
        if exited:
            raise SystemExit(f"waiting for {what}: {' and '.join(exited)} exited (its error is above)")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.05)


@dataclasses.dataclass
class _Events:
    published: dict[int, float]  # version -> when publish() was called
    loaded: dict[int, float]  # version -> when the worker had it loaded
    start: float
    end: float  # the measured window: the first publication to the end of publishing


def _summary(ev: _Events, down_bytes: int, connections: int, cpu_s: float, wall_s: float) -> dict[str, Any]:
    latencies = {v: ev.loaded[v] - t0 for v, t0 in ev.published.items() if v in ev.loaded}
    first = min(latencies) if latencies else None
    rest = sorted(t for v, t in latencies.items() if v != first)
    grid = np.arange(ev.start, ev.end, 0.1)
    pub_v, pub_t = np.array(sorted(ev.published)), np.array([ev.published[v] for v in sorted(ev.published)])
    got = sorted((t, v) for v, t in ev.loaded.items())
    got_t, got_v = np.array([t for t, _ in got]), np.maximum.accumulate(np.array([v for _, v in got] or [0]))
    at = np.searchsorted(pub_t, grid, "right")  # publications up to each instant of the grid
    newest = np.where(at > 0, pub_v[np.maximum(at - 1, 0)], 0)
    at = np.searchsorted(got_t, grid, "right")
    current = np.where(at > 0, got_v[np.maximum(at - 1, 0)], 0)  # 0: none yet
    lag = newest - current
    return {
        "published": len(ev.published), "applied": len(latencies), "first_s": latencies.get(first) if first else None,
        "median_s": statistics.median(rest) if rest else None,
        "p90_s": rest[int(0.9 * (len(rest) - 1))] if rest else None, "max_s": rest[-1] if rest else None,
        "lag_median": float(np.median(lag)), "lag_max": int(lag.max()),
        "lag_max_halves": [int(lag[:len(lag) // 2].max()), int(lag[len(lag) // 2:].max())],
        "bytes_per_version": down_bytes / len(latencies) if latencies else None, "link_bytes_down": down_bytes,
        "tcp_connections": connections, "forwarder_cpu_s": cpu_s, "forwarder_cpu_share": cpu_s / wall_s,
        "latencies_s": {v: round(t, 4) for v, t in latencies.items()},
    }


def run_netrl(fmt: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    folder = tmp / fmt
    data = config_to_dict(Config())
    data.update(run_name="link", weights_folder=str(folder / "weights"), keys_dir=str(tmp / "keys"))
    data["network"].update(trainer_port=free_port(), worker_port=free_port())
    if fmt != "float32" and "weight_format" in {f.name for f in dataclasses.fields(NetworkConfig)}:
        data["network"]["weight_format"] = fmt  # the same setting in the config the roles read, once it exists
    data["server"].update(status_port=free_port())
    cfg = write_config(data, folder / "config.json")
    log = (folder / "server.log").open("wb")
    server = spawn_role("server", cfg, log_level="WARNING", stdout=log)
    procs: list[subprocess.Popen[str]] = []
    try:
        with WanLink(data["network"]["worker_port"], args.rtt_ms, args.loss, args.bandwidth_mbit) as wan:
            trainer_out: list[dict[str, Any]] = []
            worker_out: list[dict[str, Any]] = []
            trainer = _spawn("_trainer", str(cfg), str(args.hidden), fmt, str(args.budget_s), str(args.interval),
                             str(args.seconds), str(args.steps), stdin=True)
            worker = _spawn("_worker", str(cfg), str(args.hidden), str(wan.port))
            procs = [worker, trainer]
            _read(trainer, trainer_out)
            _read(worker, worker_out)
            _wait("the trainer's and the worker's connections", lambda: any("ready" in r for r in trainer_out) and any(
                "ready" in r for r in worker_out), 120, procs)
            time.sleep(1.0)  # the worker's first heartbeats and ACK window settle over the long link
            down0, cpu0, wall0 = wan.stats.bytes["down"], wan.cpu_s(), time.monotonic()  # the measured window
            assert trainer.stdin is not None
            trainer.stdin.write("go\n")
            trainer.stdin.flush()
            _wait("the trainer's publications", lambda: any("done" in r for r in trainer_out),
                  args.seconds + 120, procs)
            published = {r["v"]: r["t0"] for r in trainer_out if "t0" in r}
            end = max(published.values())
            newest = max(published)
            with contextlib.suppress(SystemExit):  # a version still on its way after the grace: counted as missing
                _wait("the newest version's arrival", lambda: any(r.get("v") == newest for r in worker_out),
                      GRACE_S, procs)
            down = wan.stats.bytes["down"] - down0
            cpu, wall, connections = wan.cpu_s() - cpu0, time.monotonic() - wall0, wan.stats.connections
            trainer.stdin.write("stop\n")
            trainer.stdin.flush()
    finally:
        stop_processes(procs, timeout=5, then=[server])
        log.close()
    loaded = {r["v"]: r["t"] for r in worker_out if "t" in r and r["v"] in published}
    out = _summary(_Events(published, loaded, min(published.values()), end), down, connections, cpu, wall)
    done = next(r for r in trainer_out if "done" in r)
    losses = [r["loss"] for r in trainer_out if r.get("loss") is not None]
    return {"run": fmt, **out, "train_s_per_version": done["train_s_median"],
            "loss_first_last": [losses[0], losses[-1]] if losses else None}


def run_raw(args: argparse.Namespace) -> dict[str, Any]:
    """The same float32 bytes, PAIR to PAIR through a WanLink of the same settings, on the same schedule."""
    import torch

    with torch.no_grad():
        payload = np.concatenate([t.numpy().ravel() for t in _actor(args.hidden).state_dict().values()]).tobytes()
    public, secret = zmq.curve_keypair()
    ctx = zmq.Context()
    sender, receiver = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    sender.curve_server, sender.curve_secretkey, sender.curve_publickey = True, secret, public
    port = sender.bind_to_random_port("tcp://127.0.0.1")
    published: dict[int, float] = {}
    loaded: dict[int, float] = {}
    try:
        with WanLink(port, args.rtt_ms, args.loss, args.bandwidth_mbit) as wan:
            rpublic, rsecret = zmq.curve_keypair()
            receiver.curve_publickey, receiver.curve_secretkey, receiver.curve_serverkey = rpublic, rsecret, public
            receiver.connect(f"tcp://127.0.0.1:{wan.port}")

            def receive() -> None:  # the far end: note the arrival, say so back over the link
                while not done.is_set():
                    if receiver.poll(50):
                        frames = receiver.recv_multipart(copy=False)
                        receiver.send(json.dumps([int(frames[0].bytes), time.time()]).encode())

            done = threading.Event()
            far = threading.Thread(target=receive, daemon=True)
            far.start()
            sender.send_multipart([b"0", b"hello"])  # the connection and CURVE handshake, before the clock starts
            sender.recv()
            down0, cpu0, wall0 = wan.stats.bytes["down"], wan.cpu_s(), time.monotonic()
            start = time.time()
            sent = version = 0  # the newest version sent (its arrival is awaited before another is sent), published
            while True:
                now = time.time()
                if now < start + args.seconds and now >= start + version * args.interval:
                    version += 1
                    published[version] = now
                if version > sent and (sent == 0 or sent in loaded):
                    sent = version
                    sender.send_multipart([str(version).encode(), payload], copy=False)
                if sender.poll(5):
                    v, t = json.loads(sender.recv())
                    loaded[v] = t
                over = now - start - args.seconds
                if over > 0 and ((sent == version and sent in loaded) or over > GRACE_S):
                    break
            # the receiver is the link's client: "down" runs from the sender to it, as from the server to a worker
            down = wan.stats.bytes["down"] - down0
            cpu, wall, connections = wan.cpu_s() - cpu0, time.monotonic() - wall0, wan.stats.connections
            done.set()
            far.join(5)  # a socket is closed by the thread that used it last, never under a thread still using it
    finally:
        ctx.destroy(0)
    out = _summary(_Events(published, loaded, start, max(published.values())), down, connections, cpu, wall)
    return {"run": "raw ZeroMQ, one hop (float32)", **out, "payload_bytes": len(payload)}


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(results: list[dict[str, Any]]) -> list[str]:
    base = next((r.get("median_s") for r in results if r["run"] == "float32"), None)
    lines = ["| run | bytes per version | versions applied / published | first version | publish -> loaded median / "
             "p90 / max | vs float32 | version lag median / max (max in 1st / 2nd half) | TCP connections | "
             "forwarder CPU |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['run']} | failed: {r['error']} |" + " |" * 7)
            continue
        ratio = f"{base / r['median_s']:.2f}x faster" if base and r["median_s"] else "-"
        lines.append(f"| {r['run']} | {_num(r['bytes_per_version'], ',.0f')} | {r['applied']} / {r['published']} | "
                     f"{_num(r['first_s'], '.2f')} s | {_num(r['median_s'], '.2f')} / {_num(r['p90_s'], '.2f')} / "
                     f"{_num(r['max_s'], '.2f')} s | {ratio} | {r['lag_median']:g} / {r['lag_max']} "
                     f"({r['lag_max_halves'][0]} / {r['lag_max_halves'][1]}) | {r['tcp_connections']} | "
                     f"{r['forwarder_cpu_s']:.1f} s ({r['forwarder_cpu_share']:.0%}) |")
    return lines


def verdict(results: list[dict[str, Any]]) -> str | None:
    """The issue's target, when both rows ran: auto's median publish -> loaded at least 4x below float32's."""
    med = {r["run"]: r.get("median_s") for r in results}
    if not med.get("float32") or not med.get("auto"):
        return None
    ratio = med["float32"] / med["auto"]
    return f"target: auto at least 4x faster than float32: {'met' if ratio >= 4 else 'NOT met'} ({ratio:.2f}x)"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("_trainer", "_worker"):  # a child process
        import signal

        # the parent stops children with SIGINT, which a shell's background job would otherwise ignore
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with contextlib.suppress(KeyboardInterrupt):
            (child_trainer if sys.argv[1] == "_trainer" else child_worker)(*sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default=FORMATS, help="comma-separated weight formats, one row each")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the trainer publishes, per format")
    parser.add_argument("--quick", action="store_true", help="8 s per format (noisy; for trying the script out)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between two publications")
    parser.add_argument("--steps", type=int, default=8, help="Adam steps (batch 64) between two publications")
    parser.add_argument("--hidden", type=int, default=960, help="hidden width of the actor (64 -> h -> h -> 2x8)")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="network.weight_budget_s (formats but float32; 0, the default: the time between "
                        "publications)")
    parser.add_argument("--bandwidth-mbit", type=float, default=10.0, help="bandwidth each way, Mbit/s")
    parser.add_argument("--rtt-ms", type=float, default=100.0, help="round trip of the emulated link")
    parser.add_argument("--loss", type=float, default=0.01, help="segment loss probability (see wan_link.py)")
    parser.add_argument("--no-raw", action="store_true", help="skip the raw ZeroMQ baseline row")
    parser.add_argument("--json", default="bench_weights_link.json", help="where to write the results")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 8.0
    formats = [f for f in args.formats.split(",") if f]
    if not formats or args.seconds <= 0 or args.interval <= 0 or args.steps < 0:
        parser.error("--formats needs a format, --seconds and --interval must be > 0, --steps >= 0")
    params = sum(p.numel() for p in _actor(args.hidden).parameters())
    print(f"actor: {OBS} -> {args.hidden} -> {args.hidden} -> 2x{ACT}, {params:,} parameters; link: "
          f"{args.bandwidth_mbit:g} Mbit/s, {args.rtt_ms:g} ms round trip, {args.loss:.0%} loss; a version every "
          f"{args.interval:g} s for {args.seconds:g} s per format", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="netrl-wlink-") as d:
        tmp = Path(d)
        keygen(tmp / "keys")
        if not args.no_raw:
            results.append(run_raw(args))
            print("\n".join(table(results)[-1:]), flush=True)
        for fmt in formats:
            try:
                results.append(run_netrl(fmt, args, tmp))
            except SystemExit as exc:  # e.g. a format this checkout does not know: the child's error is above
                results.append({"run": fmt, "error": str(exc)})
            print("\n".join(table(results)[-1:]), flush=True)
    lines = table(results)
    target = verdict(results)
    print("\n".join(lines + ([target] if target else [])))
    Path(args.json).write_text(json.dumps({"params": params, "settings": vars(args), "results": results,
                                           "table": lines, "target": target}, indent=1))
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
