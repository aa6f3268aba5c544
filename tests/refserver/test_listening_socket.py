"""The refserver's socket: accepted connections get TCP_NODELAY from asyncio, as uvicorn's own bind does."""

from __future__ import annotations

import asyncio
import socket

from pytest_dflash.refserver.server import listening_socket


def nodelay_of_accepted(sock: socket.socket) -> int:
    """Serve `sock` with asyncio, connect once, and read TCP_NODELAY off the server side of that connection."""

    async def main() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def accepted(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            inner = writer.get_extra_info("socket")
            seen.set_result(inner.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            value = await asyncio.wait_for(seen, 10)
            writer.close()
        return value

    return asyncio.run(main())


def test_accepted_connections_have_nodelay() -> None:
    assert nodelay_of_accepted(listening_socket("127.0.0.1", 0)) != 0


def test_a_socket_without_the_tcp_proto_would_not_have_it() -> None:
    # The bug this guards against: socket(AF_INET, SOCK_STREAM) has proto 0 and asyncio skips it.
    bare = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    bare.bind(("127.0.0.1", 0))
    assert nodelay_of_accepted(bare) == 0
