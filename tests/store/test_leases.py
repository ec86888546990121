"""Leases in the store (clawrl.store.leases), on SQLite and PostgreSQL: one holder at a time,
renewal, expiry, release, forced take-over, and two stores racing for one lease."""

from __future__ import annotations

import threading
import time

import pytest

from clawrl.store import Store
from clawrl.store.leases import TRAINER_LEASE, judge_claim


def test_one_holder_at_a_time_until_it_expires_or_is_released(store_target):
    with Store(store_target()) as store:
        assert store.acquire_lease(TRAINER_LEASE, "a", 30) is None  # taken
        other = store.acquire_lease(TRAINER_LEASE, "b", 30)
        assert other is not None and other.holder == "a" and other.expires_at > time.time() + 20
        assert store.acquire_lease(TRAINER_LEASE, "a", 60) is None  # renewed
        renewed = store.get_lease(TRAINER_LEASE)
        assert renewed is not None and renewed.expires_at > time.time() + 50
        store.release_lease(TRAINER_LEASE, "b")  # not b's: nothing happens
        assert store.get_lease(TRAINER_LEASE).holder == "a"  # type: ignore[union-attr]
        store.release_lease(TRAINER_LEASE, "a")
        assert store.get_lease(TRAINER_LEASE) is None
        assert store.acquire_lease(TRAINER_LEASE, "b", 0.2) is None
        assert store.acquire_lease(TRAINER_LEASE, "a", 30) is not None
        time.sleep(0.3)  # b's lapsed
        assert store.acquire_lease(TRAINER_LEASE, "a", 30) is None
        assert store.acquire_lease(TRAINER_LEASE, "c", 30, force=True) is None  # a is dead
        assert store.get_lease(TRAINER_LEASE).holder == "c"  # type: ignore[union-attr]
        with pytest.raises(ValueError):
            store.acquire_lease(TRAINER_LEASE, "c", 0)


def test_expired_claims_are_purged(store_target):
    with Store(store_target()) as store:
        store.acquire_lease(judge_claim("t1"), "w", 0.01)
        store.acquire_lease(judge_claim("t2"), "w", 30)
        time.sleep(0.05)
        assert store.purge_leases(expired_for_s=0.0) == 1
        assert store.get_lease(judge_claim("t1")) is None
        assert store.get_lease(judge_claim("t2")) is not None


def test_two_stores_racing_for_a_lease_get_one_holder(store_target):
    target = store_target()
    Store(target).close()
    won: list[str] = []
    start = threading.Barrier(4)

    def race(who: str) -> None:
        with Store(target) as store:
            start.wait()
            for i in range(20):
                if store.acquire_lease(f"race-{i}", who, 30) is None:
                    won.append(f"{i}:{who}")

    threads = [threading.Thread(target=race, args=(f"p{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(int(w.split(":")[0]) for w in won) == list(range(20))  # one winner per lease
