"""The proxy-only bridge's outer end keeps one execution to its share of proxy connections."""

from __future__ import annotations

import asyncio

from gyre.harness.forwarder import UnixForwarder


async def test_connections_past_the_share_are_closed(tmp_path):
    held: list[asyncio.StreamWriter] = []

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        held.append(w)
        await r.read()  # until the client goes

    srv = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    fw = await UnixForwarder(tmp_path / "p.sock", "127.0.0.1", port, max_connections=8).start()
    conns = [await asyncio.open_unix_connection(str(tmp_path / "p.sock")) for _ in range(12)]
    await asyncio.sleep(0.3)
    closed = 0
    for r, _ in conns:
        try:
            closed += (await asyncio.wait_for(r.read(1), 0.2)) == b""
        except TimeoutError:
            pass
    assert closed == 4 and len(held) == 8, (closed, len(held))
    for _, w in conns:
        w.close()
    await fw.stop()
    srv.close()
    await srv.wait_closed()


async def test_stop_with_open_connections_logs_no_traceback(tmp_path):
    """stop() cancels each open connection's task; none may surface as an 'Exception in
    callback' CancelledError in the loop's log (it did, once per open connection)."""
    errors: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

    async def upstream(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await r.read()

    srv = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    fw = await UnixForwarder(tmp_path / "p.sock", "127.0.0.1", port).start()
    conns = [await asyncio.open_unix_connection(str(tmp_path / "p.sock")) for _ in range(3)]
    await asyncio.sleep(0.3)  # all three piping
    await fw.stop()
    await asyncio.sleep(0.1)  # the stream callbacks run after the tasks end
    for r, w in conns:
        assert await asyncio.wait_for(r.read(), 2) == b""  # closed by the forwarder
        w.close()
    srv.close()
    await srv.wait_closed()
    loop.set_exception_handler(None)
    assert errors == [], [str(e.get("exception") or e.get("message")) for e in errors]
