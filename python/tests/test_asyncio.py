"""asyncio on the ABI 1.3 event descriptor: no helper thread."""
import asyncio
import os
import select
import threading

import pytest

import kvxfer
import kvxfer.aio
from kvxfer import demo


def _readable(fd):
    return bool(select.select([fd], [], [], 0)[0])


def test_event_fd_is_readable_exactly_while_events_are_pending(read_pair):
    fd = read_pair.d.event_fd()
    assert fd == read_pair.d.event_fd()      # one descriptor per engine
    assert not _readable(fd)
    tid = "tx-fd"
    read_pair.start_read(tid)
    r, _, _ = select.select([fd], [], [], 20)   # sleeps in the kernel
    assert r == [fd]
    assert _readable(fd)                     # level: stays until taken
    read_pair.d.wait_transfer(tid, 20000)
    evs = read_pair.d.poll_events()
    assert [e.type for e in evs] == ["FINISHED_RECVING"]
    assert not _readable(fd)                 # poll_events drained it
    demo.verify_decode(read_pair.d_kv)
    # P: the descriptor created after the event was queued is readable.
    read_pair.p.wait_events(20000)
    assert _readable(read_pair.p.event_fd())
    assert read_pair.p.poll_events()[0].type == "FINISHED_SENDING"
    assert not _readable(read_pair.p.event_fd())


def test_await_transfer_and_async_events_without_a_thread(read_pair):
    tid = "tx-aio"
    threads_before = threading.active_count()

    async def main():
        read_pair.start_read(tid)
        ev = await read_pair.d.aio.wait_transfer(tid, timeout=20)
        assert threading.active_count() == threads_before
        assert ev.type == "FINISHED_RECVING" and ev.transfer_id == tid
        demo.verify_decode(read_pair.d_kv)
        got = []
        async for e in read_pair.p.aio.events(idle_timeout=20):
            got.append(e)
            break
        assert [e.type for e in got] == ["FINISHED_SENDING"]
        assert got[0].request_id == read_pair.rid

    asyncio.run(asyncio.wait_for(main(), 60))


def test_await_many_transfers_concurrently(read_pair):
    """Several awaits share the descriptor; each gets its own event."""
    tids = ["tx-aio-%d" % i for i in range(3)]

    async def one(tid):
        read_pair.start_read(tid)
        return await read_pair.d.aio.wait_transfer(tid, timeout=20)

    async def main():
        return await asyncio.gather(*(one(t) for t in tids))

    evs = asyncio.run(asyncio.wait_for(main(), 60))
    assert [e.transfer_id for e in evs] == tids
    assert all(e.type == "FINISHED_RECVING" for e in evs)


def test_await_timeout_and_failure(read_pair):
    async def timeout():
        await read_pair.d.aio.wait_transfer("never", timeout=0.05)

    with pytest.raises(kvxfer.KvxTimeout):
        asyncio.run(timeout())

    async def failed():
        # A consumer request to a P port nobody listens on fails: the FAILED
        # event carries the blocks to recompute.
        hs, nt = demo.free_ports(2)
        params = {"transfer_id": "tx-dead", "do_remote_prefill": True,
                  "remote_host": "127.0.0.1", "remote_handshake_port": hs,
                  "remote_notify_port": nt, "remote_block_ids": [1, 2],
                  "remote_engine_id": "127.0.0.1:%d" % hs, "tp_size": 1}
        read_pair.d.consumer_request("rid-dead", params, [3, 4])
        await read_pair.d.aio.wait_transfer("tx-dead", timeout=30)

    with pytest.raises(kvxfer.TransferFailed) as e:
        asyncio.run(failed())
    assert e.value.event.type == "FAILED"
    assert e.value.event.block_ids == [3, 4]
    assert e.value.name.startswith("KVX_ERR_")


class _FakeEngine:
    """The part of Engine that EngineAio uses, with a pipe as the event
    descriptor: readable while the 'library' holds events, drained by every
    take, as the real one is."""

    def __init__(self):
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._plock = threading.Lock()
        self._pending = []
        self._ev_count = 0
        self._lib = []

    def event_fd(self):
        return self._r

    def push(self, tid):
        self._lib.append(kvxfer.Event("FINISHED_RECVING", 0, "KVX_OK", tid,
                                      "rid", "", []))
        os.write(self._w, b"x")

    def _take_events(self):
        try:
            while os.read(self._r, 64):
                pass
        except BlockingIOError:
            pass
        with self._plock:
            self._pending.extend(self._lib)
            self._ev_count += len(self._lib)
            self._lib.clear()

    def take_event(self, tid):
        self._take_events()
        with self._plock:
            for i, e in enumerate(self._pending):
                if e.transfer_id == tid:
                    return self._pending.pop(i)
        return None

    def close(self):
        os.close(self._r)
        os.close(self._w)


def test_waiter_wakes_when_another_coroutine_took_its_event():
    """CI saw tx-aio-0 time out in test_await_many_transfers_concurrently:
    a second waiter's take_event drained the descriptor together with the
    first waiter's event, so the reader callback never fired and the first
    slept to its deadline. Here the interleaving is forced: A waits, both
    events arrive, B takes them before the loop polls the descriptor."""
    eng = _FakeEngine()
    aio = kvxfer.aio.EngineAio(eng)

    async def main():
        a = asyncio.ensure_future(aio.wait_transfer("a", timeout=5))
        for _ in range(100):        # yield to the loop until A is parked
            if aio._changed is not None and aio._changed._waiters:
                break
            await asyncio.sleep(0)
        assert aio._changed._waiters and not a.done()
        eng.push("a")
        eng.push("b")
        evb = await aio.wait_transfer("b", timeout=5)  # drains both
        assert evb.transfer_id == "b"
        return (await a).transfer_id

    try:
        assert asyncio.run(asyncio.wait_for(main(), 10)) == "a"
    finally:
        aio.close()
        eng.close()
