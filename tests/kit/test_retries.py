"""The standard library's Cloud Storage client against a server that refuses now and then: a transient
refusal (503) is retried and the save lands; one that never ends loses that save, and flush() says so."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from respawnkit import CheckpointSaver
from respawnkit.notice import Notice
from respawnkit.progress import Progress
from respawnkit.stores import _JsonApiStore


class Server:
    def __init__(self) -> None:
        self.posts: list[str] = []
        self.deletes: list[str] = []
        self.refuse: set[int] = set()  # which POSTs (1-based) answer 503
        self.refuse_deletes = 0  # how many DELETEs answer 503 first
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server.lock:
                    server.posts.append(self.path.split("name=")[1])
                    code = 503 if len(server.posts) in server.refuse or "all" in server.refuse else 200
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def do_DELETE(self) -> None:
                with server.lock:
                    server.deletes.append(self.path.rsplit("/o/", 1)[1])
                    code = 503 if len(server.deletes) <= server.refuse_deletes else 204
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    s = Server()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{s.http.server_port}")
    yield s
    s.http.shutdown()


def save_two_files(store: _JsonApiStore) -> CheckpointSaver:
    saver = CheckpointSaver(store=store, every_s=None, sigterm=Notice(), progress=Progress(""))

    def write(folder: str) -> None:
        for name in ("a.bin", "b.bin"):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(b"x" * 10)

    saver.save(100, write)
    return saver


def test_one_transient_503_is_retried_and_the_save_lands(server: Server) -> None:
    server.refuse = {3}  # the save's second object, once
    server.refuse_deletes = 1  # and the removal of its "-unfinished" object, once
    store = _JsonApiStore("gs://bucket/ckpt")
    store.backoff = 0.05
    saver = save_two_files(store)
    assert saver.flush(10)
    assert saver.saved_step == 100 and not saver.errors
    assert server.posts == ["ckpt%2Fstep-000000100-unfinished", "ckpt%2Fstep-000000100%2Fa.bin",
                            "ckpt%2Fstep-000000100%2Fb.bin", "ckpt%2Fstep-000000100%2Fb.bin",
                            "ckpt%2Fstep-000000100%2F_SUCCESS"]
    assert server.deletes == ["ckpt%2Fstep-000000100-unfinished"] * 2


def test_an_upload_that_keeps_failing_makes_flush_false_and_names_the_step(server: Server, capfd) -> None:
    server.refuse = {"all"}
    store = _JsonApiStore("gs://bucket/ckpt")
    store.backoff, store.retry_for = 0.05, 0.5
    saver = save_two_files(store)
    assert not saver.flush(10)
    assert saver.saved_step is None
    assert "flush: the upload of step 100" in capfd.readouterr().err
    assert saver.flush(1)  # said once: a later flush with nothing new failing is True
