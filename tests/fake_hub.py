"""A Hugging Face Hub on loopback that serves one folder as one model repository, at one commit:
enough of the hub's HTTP API for huggingface_hub's model_info, snapshot_download and
hf_hub_download (HF_ENDPOINT=its url), for tests that download with no network. It records the
files downloaded, to see what a download fetched."""
import hashlib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "c0ffee" + "0" * 34


class FakeHub:
    def __init__(self, repo_id: str, folder: str):
        self.repo_id = repo_id
        self.files = {}
        for name in os.listdir(folder):
            with open(os.path.join(folder, name), "rb") as f:
                self.files[name] = f.read()
        self.downloaded: list[str] = []  # the files fetched (GET), in order
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeHub":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, path: str) -> tuple[int, dict, bytes]:
        """(status, headers, body) of a request for `path`, as the hub answers it."""
        api = f"/api/models/{self.repo_id}"
        if path.startswith("/api/models/") and not path.startswith(api):
            return 404, {"X-Error-Code": "RepoNotFound"}, b'{"error": "Repository not found"}'
        info = re.fullmatch(rf"{api}(?:/revision/([^/]+))?", path)
        if info:
            if info.group(1) not in (None, "main", COMMIT):
                return 404, {"X-Error-Code": "RevisionNotFound"}, b'{"error": "Invalid rev id"}'
            siblings = [{"rfilename": name} for name in self.files]
            return 200, {}, json.dumps({"id": self.repo_id, "sha": COMMIT, "siblings": siblings}).encode()
        if path.startswith(f"{api}/tree/"):
            tree = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in self.files.items()]
            return 200, {}, json.dumps(tree).encode()
        file = re.fullmatch(rf"/{self.repo_id}/resolve/[^/]+/(.+)", path)
        if file and file.group(1) in self.files:
            data = self.files[file.group(1)]
            return 200, {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}, data
        return 404, {}, b"not found"


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _answer(self, with_body: bool) -> None:
            path = self.path.split("?")[0]
            status, headers, body = hub.answer(path)
            if with_body and status == 200 and "/resolve/" in path:
                hub.downloaded.append(path.rsplit("/", 1)[1])
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(with_body=True)

        def do_HEAD(self) -> None:
            self._answer(with_body=False)

    return Handler
