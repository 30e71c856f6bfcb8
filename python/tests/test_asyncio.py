"""asyncio on the ABI 1.3 event descriptor: no helper thread."""
import asyncio
import os
import select
import threading

import pytest

import kvxfer
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
