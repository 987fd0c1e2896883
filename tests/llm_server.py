"""A chat-completions server on loopback that serves recorded answers in order."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SOFTMAX_BODY = """
using G = aicg::RowGroup<THREADS, TOPOLOGY>;
const long long row = G::row();
if (row >= rows) return;
const T* xr = x + row * x_stride;
float m = aicg::Max().identity();
aicg::for_each<1>(xr, cols, G::lane(), G::lanes, false, [&](int, float v) { m = aicg::Max()(m, v); });
m = aicg::row_reduce<THREADS, TOPOLOGY>(m, aicg::Max());
float s = 0.0f;
aicg::for_each<1>(xr, cols, G::lane(), G::lanes, false, [&](int, float v) { s += expf(v - m); });
s = aicg::row_reduce<THREADS, TOPOLOGY>(s, aicg::Sum());
const float inv = 1.0f / s;
aicg::map_row<1>(xr, nullptr, nullptr, y + row * cols, cols, G::lane(), G::lanes, false,
                 [&](int, float v, float, float) { return expf(v - m) * SCALE; });
"""

CORRECT = SOFTMAX_BODY.replace("SCALE", "inv")
WRONG = SOFTMAX_BODY.replace("SCALE", "1.0f")           # forgets to normalise
BROKEN = SOFTMAX_BODY.replace("float s = 0.0f;", "float s = 0.0f")   # a missing semicolon


def answer(body: str, declares=("tree_reduction",), threads=256, topology="block") -> str:
    content = json.dumps({"threads": threads, "topology": topology, "declares": list(declares), "body": body})
    return json.dumps({"id": "recorded", "object": "chat.completion",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "```json\n" + content + "\n```"},
                                    "finish_reason": "stop"}]})


class ChatServer:
    def __init__(self, answers: list[str]):
        self.answers, self.requests = list(answers), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                server.requests.append({"path": self.path, "headers": dict(self.headers),
                                        "json": json.loads(self.rfile.read(length))})
                if not self.path.endswith("/chat/completions"):
                    self.send_response(404)
                    self.end_headers()
                    return
                body = server.answers[min(len(server.requests), len(server.answers)) - 1].encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def synth_profile(url: str, proposers='["llm", "template"]', shapes="[[64, 1000]]") -> str:
    """A one-operator profile with the repair loop on, asking the server at `url`."""
    return f"""
[instance]
name = "small"
target = "nvidia-h200"
preservation = "tolerance"

[plan]
candidates_per_family = 1

[synthesis]
proposers = {proposers}
rounds = 3

[synthesis.llm]
base_url = "{url}"
model = "recorded-model"
api_key_env = "AICG_TEST_LLM_KEY"

[[workload]]
ops = ["softmax"]
dtypes = ["float32"]
shapes = {shapes}
"""
