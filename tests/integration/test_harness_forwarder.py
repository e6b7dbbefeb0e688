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
