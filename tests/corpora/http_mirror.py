"""A local HTTP server standing in for OpenSLR or a mirror: serves byte strings by path, honours
``Range: bytes=N-`` (206), and can drop a connection half-way or ignore ranges, to test
resumed and restarted downloads."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Mirror:
    """``files[path] = bytes``; ``drop[path] = n`` cuts the next ``n`` responses of ``path``
    after half their bytes; ``ignore_range`` answers every request with the whole file;
    ``requests`` logs ``(path, Range header or None)``."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.drop: dict[str, int] = {}
        self.ignore_range = False
        self.requests: list[tuple[str, str | None]] = []
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                mirror.requests.append((self.path, self.headers.get("Range")))
                body = mirror.files.get(self.path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                start = 0
                range_header = self.headers.get("Range")
                if range_header and not mirror.ignore_range:
                    start = int(range_header.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                part = body[start:]
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                if mirror.drop.get(self.path, 0) > 0:
                    mirror.drop[self.path] -= 1
                    self.wfile.write(part[: len(part) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(part)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
