"""`python studies/sync_bench.py`: one policy sync's seconds and peak host memory, per transport.

Setting: a random-init policy of Qwen2.5-0.5B's shape (`shapes.SHAPES["target"]`, tied head as in 0.5B),
held in fp32 by the driver as a trainer holds it, saved once; an embedded loopback Ray cluster runs one
`RolloutController` per transport (the object store, then a gloo broadcast group; one at a time, so the
machine holds one set of workers), each with `--workers` CPU workers serving the policy in `--dtype`, and
the driver syncs its parameters (what `gather_policy_weights` reads: a tied head once), one untimed
warm-up sync and then `--repeats`. Per sync it prints (medians):

- seconds (`RolloutController.sync_policy`: wait for workers, stage, post, commit);
- the peak host memory the sync added, per process: its resident high-water mark (`VmHWM`, reset through
  `/proc/<pid>/clear_refs` just before) above its resident size before — the driver (the sender) and the
  workers, summed; pages of the object store count in every process that touches them;
- the machine's: how far `MemAvailable` fell below its level before, at its lowest during the sync
  (sampled every 5 ms; anything else running on the machine moves it too).

Both against the payload: the parameters' bytes as the driver holds them. Linux only (`/proc`). On a
shared machine the seconds are indicative.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
from dataclasses import dataclass

import torch

from specroll.bench.shapes import SHAPES, build

TRANSPORTS = ("object_store", "torch_distributed")


@dataclass(frozen=True)
class SyncSample:
    """One sync: its seconds, the peak resident growth per process (bytes, sender first) and the system's."""

    seconds: float
    process_growth: tuple[int, ...]
    system_growth: int


def resident(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of process `pid` in bytes."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def reset_peak(pid: int) -> int:
    """Reset `pid`'s resident high-water mark to its resident size now; returns that size."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")
    return resident(pid)[0]


class AvailableLow:
    """The lowest `MemAvailable` seen while the context runs (a 5 ms sampler thread)."""

    def __enter__(self) -> AvailableLow:
        self.before = self.low = available()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.low = min(self.low, available())

    @property
    def growth(self) -> int:
        return self.before - self.low


def available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def actor_pid(actor) -> int:
    """The process id of a Ray actor (asked inside it)."""
    import ray

    return ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))


def measure_sync(controller, named: dict[str, torch.Tensor], version: int, pids: list[int]) -> SyncSample:
    """`controller.sync_policy(named, version)`, with the peak host memory it added (`pids`: sender first)."""
    before = [reset_peak(pid) for pid in pids]
    with AvailableLow() as low:
        seconds = controller.sync_policy(named, version)
    growth = tuple(max(0, resident(pid)[1] - rss) for pid, rss in zip(pids, before))
    return SyncSample(seconds, growth, low.growth)


def run_transport(transport: str, root: str, named: dict[str, torch.Tensor], args) -> list[SyncSample]:
    """A controller on `transport` serving the policy saved in `root`; one untimed sync, then `args.repeats`."""
    from specroll.integrations.model_source import ModelPaths
    from specroll.integrations.ray_backend.controller import RolloutController
    from specroll.integrations.ray_backend.settings import ControllerConfig, SyncConfig, TopologyConfig
    from specroll.rollout import EngineConfig

    controller = RolloutController(ControllerConfig(
        ModelPaths(root), engine=EngineConfig(max_batch_size=1, max_seq_len=64, gamma=0, dtype=args.dtype),
        topology=TopologyConfig(num_workers=args.workers, placement_strategy=None),
        sync=SyncConfig(transport=transport, bucket_mb=args.bucket_mb, timeout_s=600.0),
    ))
    try:
        pids = [os.getpid(), *(actor_pid(w) for w in controller.workers)]
        samples = [measure_sync(controller, named, version, pids) for version in range(1, args.repeats + 2)]
    finally:
        controller.shutdown()
    return samples[1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="target", choices=sorted(SHAPES), help="a `shapes.SHAPES` entry")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", help="the workers' engine dtype")
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only, before Ray is imported
    import ray

    from specroll.integrations.ray_backend.cluster import connect_ray

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    policy = build(args.shape, seed=0, tied=True)
    named = {name: param.detach() for name, param in policy.named_parameters()}
    payload = sum(t.numel() * t.element_size() for t in named.values())
    with tempfile.TemporaryDirectory() as root:
        policy.save_pretrained(root, state_dict={k: v.to(getattr(torch, args.dtype)) for k, v in named.items()})
        connect_ray(None, num_cpus=args.workers, log_to_driver=False)
        try:
            samples = {transport: run_transport(transport, root, named, args) for transport in TRANSPORTS}
        finally:
            ray.shutdown()
    load = os.getloadavg()
    print(f"# sync_bench: {args.shape} ({sum(t.numel() for t in named.values()) / 1e6:.0f}M params), payload "
          f"{payload / 2**20:.0f} MiB fp32, engine {args.dtype}, {args.workers} CPU workers, {args.bucket_mb:g} MiB "
          f"buckets, {args.repeats} repeats (median), load {load[0]:.2f}, {os.cpu_count()} cores")
    print("| transport | sync s | sender peak × payload | worker peak × payload (max) | sender + 1 worker "
          "× payload | all processes × payload | MemAvailable drop × payload |")
    print("|---|---|---|---|---|---|---|")
    median = statistics.median
    for transport, runs in samples.items():
        sender = median([s.process_growth[0] for s in runs]) / payload
        worker = median([max(s.process_growth[1:]) for s in runs]) / payload
        pair = median([s.process_growth[0] + max(s.process_growth[1:]) for s in runs]) / payload
        total = median([sum(s.process_growth) for s in runs]) / payload
        system = median([s.system_growth for s in runs]) / payload
        print(f"| {transport} | {median([s.seconds for s in runs]):.2f} | {sender:.2f} | {worker:.2f} | {pair:.2f} | "
              f"{total:.2f} | {system:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
