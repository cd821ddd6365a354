"""RoundStop: the controller tells a learner round running on the `LearnerActor` to stop training now.

An actor runs one caller's calls in order (`learner_driver` relies on it), so a second call cannot reach a round
that is running. The signal goes through the cluster's key-value store instead (GCS, the store Ray's own
libraries keep their state in): the controller writes the round's key when it collects the round
(`finish_learner_round(stop=True)`: the trainer wants its next rollouts, and every learner second from here on is
one it waits), and the round, polling its key between optimizer steps (at most every `POLL_S`), stops training and
gates what it has. The key is the round's own (a fresh uuid), deleted once the round is collected, so a stop that
arrives after its round ended reaches no later one.
"""

from __future__ import annotations

import time
import uuid

from ray.experimental import internal_kv

NAMESPACE = "specroll-learner-rounds"
POLL_S = 0.2  # a GCS round trip per poll (~1 ms): against a 0.1-0.5 s optimizer step, nil


def new_key() -> str:
    return f"round-{uuid.uuid4().hex}"


def request_stop(key: str) -> None:
    internal_kv._internal_kv_put(key, b"stop", namespace=NAMESPACE)


def forget(key: str) -> None:
    internal_kv._internal_kv_del(key, namespace=NAMESPACE)


class StopPoll:
    """`stop()` for `Learner.train_round`: whether round `key`'s stop was requested (polled at most every
    `POLL_S`; once seen, remembered)."""

    def __init__(self, key: str, poll_s: float = POLL_S):
        self.key, self.poll_s = key, poll_s
        self._next, self._stopped = 0.0, False

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self._stopped and now >= self._next:
            self._next = now + self.poll_s
            self._stopped = internal_kv._internal_kv_get(self.key, namespace=NAMESPACE) is not None
        return self._stopped
