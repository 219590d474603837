"""The memory tier: an LRU bounded by bytes."""

from __future__ import annotations

import threading

from cuforge.store.base import Entry
from cuforge.store.memory import MemoryStore, entry_cost

from .helpers import key_of


def _entry(i: int, size: int = 1000, **meta) -> Entry:
    return Entry(key_of(i), "kernel", bytes([i % 256]) * size, {"name": f"k{i}.cu", **meta})


def test_roundtrip_and_delete():
    store = MemoryStore(1 << 20)
    e = _entry(1, lowered_names={"f<1>": "_Z1fILi1EEvv"})
    assert store.get(e.key) is None
    assert store.put(e)
    got = store.get(e.key)
    assert got == e and got.payload == e.payload and got.meta["lowered_names"]
    st = store.stats()
    assert (st.tier, st.entries, st.hits, st.misses, st.puts) == ("memory", 1, 1, 1, 1)
    assert st.bytes == entry_cost(e) == store.total_bytes()
    assert [i.key for i in store.iterate()] == [e.key]
    assert store.delete(e.key) and not store.delete(e.key)
    assert store.get(e.key) is None and store.total_bytes() == 0


def test_put_replaces():
    store = MemoryStore(1 << 20)
    store.put(_entry(1, 100))
    bigger = Entry(key_of(1), "kernel", b"y" * 5000, {})
    store.put(bigger)
    assert store.get(key_of(1)).payload == b"y" * 5000
    assert store.total_bytes() == entry_cost(bigger)
    assert len(store) == 1


def test_lru_bounded_by_bytes():
    one = entry_cost(_entry(0))
    store = MemoryStore(one * 3 + one // 2)  # room for three entries
    for i in range(3):
        assert store.put(_entry(i))
    store.get(key_of(0))  # 0 is now the most recently used; 1 is the least
    store.put(_entry(3))
    assert key_of(1) not in store
    assert all(key_of(i) in store for i in (0, 2, 3))
    assert store.total_bytes() <= store.max_bytes
    assert store.stats().evictions == 1


def test_size_counts_metadata():
    store = MemoryStore(1 << 20)
    small = Entry(key_of(1), "kernel", b"x", {})
    chatty = Entry(key_of(2), "kernel", b"x", {"log": "warning " * 10_000})
    assert entry_cost(chatty) > entry_cost(small) + 70_000
    store.put(chatty)
    assert store.total_bytes() > 70_000


def test_oversized_entry_is_not_stored():
    store = MemoryStore(10_000)
    assert not store.put(Entry(key_of(1), "kernel", b"x" * 20_000, {}))
    assert store.get(key_of(1)) is None and store.total_bytes() == 0


def test_threads():
    store = MemoryStore(entry_cost(_entry(0, 100)) * 50)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(2000):
                e = _entry((t * 7 + i) % 200, 100)
                store.put(e)
                got = store.get(e.key)
                if got is not None:
                    assert got.payload == e.payload
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert store.total_bytes() <= store.max_bytes
    assert store.total_bytes() == sum(entry_cost(store.peek(i.key)) for i in store.iterate())
