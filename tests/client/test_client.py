"""The Python client, blocking and asyncio, against a real server (and against small fake
servers for the failure paths: wrong version, silence, dropped connections)."""
import asyncio
import socket
import threading
import time

import pytest

from tryll_fast import codec
from tryll_fast.client import AsyncTryllClient, ReaderThreadError, TryllClient, TryllError
from tryll_fast.errors import ErrorCode

from wire import start_server, wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("client-srv"))
    yield srv
    srv.shutdown(2)


@pytest.fixture
def client(server):
    host, port = server.address
    with TryllClient(host, port, timeout=10) as c:
        yield c


class FakeServer:
    """Accepts one connection and sends `hello` (or nothing), then behaves as told."""

    def __init__(self, hello: bytes | None, then=None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hello = hello
        self.then = then
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        conn, _ = self.sock.accept()
        if self.hello:
            conn.sendall(self.hello)
        if self.then:
            self.then(conn)
        else:
            time.sleep(3)
        conn.close()

    def close(self):
        self.sock.close()


def ready(version=29):
    return codec.encode(codec.ConnectionReady(protocol_version=version, mode="fake"))


def test_connect_reads_connection_ready(client):
    assert client.server_protocol_version == 29 and client.server_mode == "dev"
    assert client.connected


def test_session_and_model_calls(client):
    with pytest.raises(TryllError) as info:
        client.list_models()
    assert info.value.code == ErrorCode.SessionNotReady
    sid = client.create_session(locale="en-US")
    assert sid > 0 and client.session_id == sid
    names = [m.name for m in client.list_models()]
    assert "SmolLM2-135M-Instruct" in names
    client.set_session_locale("de")
    with pytest.raises(TryllError) as info:
        client.set_session_locale("en_GB")
    assert info.value.code == ErrorCode.InvalidLocale and "'-'" in info.value.message
    with pytest.raises(TryllError) as info:
        client.load_model("no-such-model")
    assert info.value.code == ErrorCode.DownloadNotAvailable
    with pytest.raises(TryllError) as info:
        client.download_model("no-such-model")
    assert info.value.code == ErrorCode.DownloadNotAvailable
    assert client.unload_model("SmolLM2-135M-Instruct") == ""
    snap = client.get_memory_consumption()
    assert isinstance(snap, codec.GetMemoryConsumptionResponse)
    assert client.debug_command("echo", "x", 3) == "x 3"
    client.set_inference_throttle(0.25)
    with pytest.raises(TryllError) as info:
        client.create_session()
    assert info.value.code == ErrorCode.SessionAlreadyExists
    assert "2003 SessionAlreadyExists" in str(info.value)


def test_replies_are_matched_by_request_id_not_by_order(client):
    client.create_session()
    slow = client.list_models_async()               # runs on the server's worker lane
    fast = [client.debug_command_async("echo", str(i)) for i in range(50)]   # answered inline
    assert [f.result(10) for f in fast] == [str(i) for i in range(50)]
    assert len(slow.result(10)) >= 5


def test_unsolicited_frames_reach_callbacks(client):
    client.create_session()
    texts = []
    unregister = client.on(codec.AnswerText, texts.append)
    seen_any = []
    client.on_any(seen_any.append)
    out = client.debug_command("stream", "200", "t")
    assert '"frames": 200' in out
    assert len(texts) == 201 and texts[-1].is_final
    assert len(seen_any) == 201
    unregister()
    client.debug_command("stream", "5")
    assert len(texts) == 201
    with pytest.raises(TypeError):
        client.on(int, print)


def test_blocking_call_on_the_reader_thread_is_refused(client):
    client.create_session()
    results = {}
    done = threading.Event()

    def on_text(_frame):
        if done.is_set():
            return
        done.set()
        try:
            client.debug_command("echo", "inside")
        except ReaderThreadError as exc:
            results["error"] = str(exc)
        results["future"] = client.debug_command_async("echo", "inside")

    client.on(codec.AnswerText, on_text)
    client.debug_command("stream", "3")
    assert done.wait(5)
    assert "reader thread" in results["error"] and "_async" in results["error"]
    assert results["future"].result(5) == "inside"


def test_timeout_is_1003(client):
    client.create_session()
    with pytest.raises(TryllError) as info:
        client.debug_command("stream", "2000000", timeout=0.05)
    assert info.value.code == ErrorCode.Timeout and "DebugCommandRequest" in info.value.message


def test_version_mismatch_is_5004_with_both_versions():
    fake = FakeServer(ready(28))
    try:
        with pytest.raises(TryllError) as info:
            TryllClient("127.0.0.1", fake.port, timeout=5).connect()
        assert info.value.code == ErrorCode.ProtocolVersionMismatch
        assert "28" in info.value.message and "29" in info.value.message
    finally:
        fake.close()


def test_connection_refused_is_1001():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(TryllError) as info:
        TryllClient("127.0.0.1", port, timeout=2).connect()
    assert info.value.code == ErrorCode.ConnectionFailed


def test_silent_server_is_1003():
    fake = FakeServer(None)
    try:
        with pytest.raises(TryllError) as info:
            TryllClient("127.0.0.1", fake.port, timeout=0.3).connect()
        assert info.value.code == ErrorCode.Timeout
    finally:
        fake.close()


def test_dropped_connection_fails_pending_requests_with_1002():
    fake = FakeServer(ready(), then=lambda conn: (conn.recv(1000), time.sleep(0.2)))
    try:
        c = TryllClient("127.0.0.1", fake.port, timeout=5).connect()
        dropped = []
        c.on_disconnect(dropped.append)
        with pytest.raises(TryllError) as info:
            c.create_session()
        assert info.value.code == ErrorCode.ConnectionDropped
        assert wait_for(lambda: dropped and dropped[0].code == ErrorCode.ConnectionDropped)
        with pytest.raises(TryllError) as info:
            c.list_models()
        assert info.value.code == ErrorCode.ConnectionDropped
        c.close()
    finally:
        fake.close()


def test_async_client_has_the_same_surface(server):
    host, port = server.address

    async def main():
        async with AsyncTryllClient(host, port, timeout=10) as c:
            assert c.server_protocol_version == 29
            with pytest.raises(TryllError) as info:
                await c.list_models()
            assert info.value.code == ErrorCode.SessionNotReady
            sid = await c.create_session(locale="fr")
            assert sid == c.session_id > 0
            models = await c.list_models()
            assert any(m.name == "Gemma-3-270M" for m in models)
            texts = []
            c.on(codec.AnswerText, texts.append)
            futs = [c.debug_command_async("echo", str(i)) for i in range(20)]
            assert await asyncio.gather(*futs) == [str(i) for i in range(20)]
            assert '"frames": 10' in await c.debug_command("stream", "10")
            assert len(texts) == 11
            with pytest.raises(TryllError) as info:
                await c.load_model("nope")
            assert info.value.code == ErrorCode.DownloadNotAvailable
            with pytest.raises(TryllError) as info:
                await c.debug_command("stream", "2000000", timeout=0.05)
            assert info.value.code == ErrorCode.Timeout
            c.set_inference_throttle(0.5)
            assert (await c.get_memory_consumption()).request_id > 0

    asyncio.run(main())
    for name in ("create_session", "list_models", "download_model", "load_model",
                 "unload_model", "delete_model", "get_memory_consumption", "debug_command",
                 "set_session_locale", "set_inference_throttle", "on", "on_any", "close"):
        assert hasattr(TryllClient, name) and hasattr(AsyncTryllClient, name), name


def test_async_version_mismatch():
    fake = FakeServer(ready(30))

    async def main():
        with pytest.raises(TryllError) as info:
            await AsyncTryllClient.open("127.0.0.1", fake.port, timeout=5)
        assert info.value.code == ErrorCode.ProtocolVersionMismatch

    try:
        asyncio.run(main())
    finally:
        fake.close()
