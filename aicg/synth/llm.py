"""An LLM proposer speaking the OpenAI-compatible chat-completions protocol.

Any server will do (vLLM, llama.cpp, Ollama, a hosted API): a base URL, a
model name and a key read from the environment. Every request and response
is stored in the content-addressed store under the hash of the request
(model, messages, parameters; never the URL or the key), so a rebuild on any
machine sharing the store replays the answer without calling the model. An
offline build whose answer was never recorded says so; the loop then asks
the next proposer.
"""
from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from .. import digest
from ..ops import OPERATORS
from .proposal import SKELETON_HEADERS, Proposal, Request

SYSTEM = """You write the body of one CUDA kernel for aicg. The body goes inside this fixed entry point,
which aicg launches itself:

    using T = <element type: float or aicg::bf16>;   constexpr int THREADS, TOPOLOGY;
    extern "C" __global__ void __launch_bounds__(THREADS) aicg_kernel(<parameters given below>) {
        <your body>
    }

Device code only: no #include, no asm, no kernel launches, no CUDA runtime calls. The headers
{headers} are included; useful pieces: aicg::RowGroup<THREADS, TOPOLOGY> (row(), lane(), lanes),
aicg::for_each<VEC>(row_ptr, cols, lane, lanes, vectorised, f), aicg::map_row<VEC>(x, w, b, y, cols,
lane, lanes, vectorised, g) (w, b: per-column vectors, read, or the literal nullptr where there are none:
g then sees 1 and 0), aicg::row_reduce<THREADS, TOPOLOGY>(value, op) with aicg::Sum / aicg::Max,
aicg::to_float, aicg::from_float<T>. The launch has ceil(rows / rows_per_block) blocks of THREADS
threads, rows_per_block = THREADS / lanes (lanes: 32 for topology "warp", THREADS for "block", 1 for
"thread"). Row r of x starts at x + r * x_stride (x_stride >= cols: x may be a slice of a wider
matrix); y is dense. Declare every transformation your body uses, by rule name; an undeclared one is rejected.

Answer with one JSON object and nothing else:
{"threads": <int>, "topology": "warp"|"block"|"thread", "declares": [<rule names>], "body": "<C++>"}"""


@dataclass(frozen=True)
class LLMSettings:
    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = 4096
    timeout: float = 120.0


def messages(request: Request, op_form: str, allowed: dict[str, str]) -> list[dict]:
    op = OPERATORS[request.op]
    lines = [f"Operator {request.op}: {op_form}", f"Element type: {request.dtype}",
             "Parameters: " + ", ".join(op.kernel_params("T")),
             "Rules you may declare (legal for this profile): " +
             "; ".join(f"{name}: {summary}" for name, summary in allowed.items())]
    for record in request.trajectory:
        p = record.get("proposal") or {}
        lines.append(f"Round {record['round']} ({p.get('proposer', '?')}): {record['outcome']}. {record.get('feedback', '')}")
    return [{"role": "system", "content": SYSTEM.replace("{headers}", ", ".join(SKELETON_HEADERS))},
            {"role": "user", "content": "\n".join(lines)}]


def parse(content: str) -> tuple[Proposal | None, str]:
    """The proposal in an answer, or None and why not."""
    text = re.sub(r"^```(?:json)?\s*|\s*```$", "", content.strip())
    start, end = text.find("{"), text.rfind("}")
    try:
        fields = json.loads(text[start:end + 1])
        proposal = Proposal("llm", "source", tuple(fields.get("declares", [])),
                            {"threads": fields["threads"], "topology": fields["topology"]}, body=fields["body"])
    except (ValueError, KeyError, TypeError) as err:
        return None, f"llm: the answer is not the JSON asked for ({err})"
    if not isinstance(proposal.body, str):
        return None, "llm: the answer's body is not a string"
    return proposal, "llm: answer parsed"


class LLMProposer:
    name = "llm"

    def __init__(self, settings: LLMSettings, store, op_form: str, allowed: dict[str, str]):
        self.settings, self.store, self.op_form, self.allowed = settings, store, op_form, allowed

    def request_body(self, request: Request) -> dict:
        s = self.settings
        return {"model": s.model, "messages": messages(request, self.op_form, self.allowed),
                "temperature": s.temperature, "max_tokens": s.max_tokens}

    def _call(self, body: dict) -> bytes:
        s = self.settings
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(s.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(s.base_url.rstrip("/") + "/chat/completions",
                                         data=json.dumps(body).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=s.timeout) as response:
            return response.read()

    def propose(self, request: Request) -> tuple[Proposal | None, str]:
        body = self.request_body(request)
        request_hash = digest.of_value(body)
        key = digest.of_value({"kind": "proposer-response", "request": request_hash})
        hit = self.store.lookup(key)
        if hit is not None and "response.json" in hit.outputs:
            raw, origin = hit.outputs["response.json"], f"replayed ({hit.origin} store)"
        else:
            try:
                raw = self._call(body)
            except (urllib.error.URLError, OSError, ValueError) as err:
                return None, (f"llm: no recorded answer for request {request_hash[:12]} and "
                              f"{self.settings.base_url} is unreachable ({getattr(err, 'reason', err)})")
            self.store.record(key, "proposer", {"response.json": raw})
            origin = "asked the model"
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return None, f"llm: the server's answer is not a chat completion ({origin})"
        proposal, note = parse(content)
        return proposal, f"{note}, {origin}, request {request_hash[:12]}"
