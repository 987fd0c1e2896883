"""Two transformer blocks through an instance, on the GPU node: a Llama-style decoder block
(Llama-3-8B's dimensions) and a GPT-2-style block (GPT-2 small's), in bfloat16, with random
weights, each run eagerly, with torch.compile (Inductor default and max-autotune) and with
aicg.backend(inst) (Inductor default and max-autotune for the rest), in one run: median time
a forward, the host's time a forward (queued behind a GPU sleep), compile time, the error
against a float64 eager run, and what the backend replaced; with --profile, where a forward's
time goes (GPU kernels, host operators). Writes JSON and prints a table.

    python tests/bench/model_bench.py --json model.json [--instance build/<name>] [--batch 1]
        [--seq 512] [--reps 20] [--variants eager,inductor,inductor-max-autotune,aicg,aicg-max-autotune] [--profile]
        (also inductor-reduce-overhead, aicg-reduce-overhead: CUDA graphs, the GPU's time without the host's)

Without --instance it builds its own (every operator in bfloat16 at the blocks' row shapes,
for this machine's GPU: `doit build target=auto`) in --work, once; later runs reuse it.
The blocks are also what tests/test_fx_backend.py (meta device) and tests/test_gpu_model.py
run, so this file defines them.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
HOST_SLEEP_CYCLES = 60_000_000   # about 35 ms at 1.7 GHz: longer than ten forwards' host time


# --- the blocks ------------------------------------------------------------------------

@dataclass(frozen=True)
class LlamaConfig:
    """Llama-3-8B (Meta, 2024: config.json of meta-llama/Meta-Llama-3-8B)."""
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    rope_theta: float = 500000.0
    eps: float = 1e-5
    max_positions: int = 8192


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2 small (Radford et al., 2019: 768 wide, 12 heads, MLP 4x, LayerNorm eps 1e-5)."""
    hidden: int = 768
    heads: int = 12
    eps: float = 1e-5
    max_positions: int = 1024


class LlamaRMSNorm(nn.Module):
    """RMSNorm as Llama's reference code writes it: in float32, rounded back, times the weight."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(dtype)


def _rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LlamaBlock(nn.Module):
    """RMSNorm, q/k/v projections, rotary embedding, grouped-query attention through
    F.scaled_dot_product_attention, output projection, residual, RMSNorm, SwiGLU, residual."""

    def __init__(self, config: LlamaConfig = LlamaConfig()):
        super().__init__()
        c = self.config = config
        self.head_dim = c.hidden // c.heads
        self.input_layernorm = LlamaRMSNorm(c.hidden, c.eps)
        self.q_proj = nn.Linear(c.hidden, c.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * self.head_dim, c.hidden, bias=False)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden, c.eps)
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)
        inverse = 1.0 / c.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        angles = torch.outer(torch.arange(c.max_positions, dtype=torch.float64), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x):
        batch, seq, _ = x.shape
        c, d = self.config, self.head_dim
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(batch, seq, c.heads, d).transpose(1, 2)
        k = self.k_proj(h).view(batch, seq, c.kv_heads, d).transpose(1, 2)
        v = self.v_proj(h).view(batch, seq, c.kv_heads, d).transpose(1, 2)
        cos, sin = self.cos[:seq].to(x.dtype), self.sin[:seq].to(x.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        repeat = c.heads // c.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(attention.transpose(1, 2).reshape(batch, seq, c.heads * d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class GPT2Block(nn.Module):
    """LayerNorm, fused q/k/v projection with bias, causal attention written out (masked
    scores, softmax), output projection, residual, LayerNorm, MLP with GELU, residual."""

    def __init__(self, config: GPT2Config = GPT2Config()):
        super().__init__()
        c = self.config = config
        self.ln_1 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.c_attn = nn.Linear(c.hidden, 3 * c.hidden)
        self.attn_proj = nn.Linear(c.hidden, c.hidden)
        self.ln_2 = nn.LayerNorm(c.hidden, eps=c.eps)
        self.c_fc = nn.Linear(c.hidden, 4 * c.hidden)
        self.gelu = nn.GELU()
        self.mlp_proj = nn.Linear(4 * c.hidden, c.hidden)
        mask = torch.tril(torch.ones(c.max_positions, c.max_positions, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, c.max_positions, c.max_positions), persistent=False)

    def forward(self, x):
        batch, seq, width = x.shape
        heads = self.config.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, seq, heads, width // heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(width // heads))
        scores = scores.masked_fill(~self.mask[:, :, :seq, :seq], float("-inf"))
        attention = F.softmax(scores, dim=-1) @ v
        x = x + self.attn_proj(attention.transpose(1, 2).contiguous().view(batch, seq, width))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


BLOCKS = {"llama": (LlamaBlock, LlamaConfig), "gpt2": (GPT2Block, GPT2Config)}
# What aicg.backend replaces in each block, with an instance that has every operator in the
# block's dtype: Llama's two RMSNorms (its residual + RMSNorm is not fused: the sum is the
# residual stream, used again, and the kernel does not return it); GPT-2's two LayerNorms and
# its attention's softmax (GELU follows a biased projection, not a bias add with a residual).
EXPECTED_REPLACEMENTS = {"llama": {"rmsnorm": 2}, "gpt2": {"layernorm": 2, "softmax": 1}}
# And, with an instance that has the matrix classes of matmul_entries, every projection with its
# epilogue onto inst.matmul: Llama's seven (q, k, v, up plain; gate with its SiLU; o and down
# with the residual added), GPT-2's four (qkv with its bias; both output projections with bias and
# residual; the MLP's first with bias and GELU).
EXPECTED_MATMUL = {"llama": 7, "gpt2": 4}


def matmul_classes(rows: int) -> list[tuple[dict, list[tuple[int, int, int]]]]:
    """(epilogue, [M, N, K] shapes) of the blocks' projections at `rows` tokens."""
    L, G = LlamaConfig, GPT2Config
    kv = L.hidden // L.heads * L.kv_heads
    return [({}, [(rows, L.hidden, L.hidden), (rows, kv, L.hidden), (rows, L.intermediate, L.hidden)]),
            ({"activation": "silu"}, [(rows, L.intermediate, L.hidden)]),
            ({"residual": True}, [(rows, L.hidden, L.hidden), (rows, L.hidden, L.intermediate)]),
            ({"bias": True}, [(rows, 3 * G.hidden, G.hidden)]),
            ({"bias": True, "residual": True}, [(rows, G.hidden, G.hidden), (rows, G.hidden, 4 * G.hidden)]),
            ({"bias": True, "activation": "gelu_erf"}, [(rows, 4 * G.hidden, G.hidden)])]


def matmul_entries(rows: int) -> str:
    """The profile's [[matmul]] entries for matmul_classes, bfloat16, F.linear's layouts."""
    def toml(epilogue: dict) -> str:
        parts = [f'{k} = {"true" if v is True else json.dumps(v)}' for k, v in epilogue.items()]
        return f"epilogue = {{ {', '.join(parts)} }}\n" if parts else ""
    return "".join(f'\n[[matmul]]\ndtypes = ["bfloat16"]\n{toml(e)}shapes = {json.dumps([list(s) for s in shapes])}\n'
                   for e, shapes in matmul_classes(rows))


def make_block(name: str, device, dtype=torch.bfloat16, seed: int = 0) -> nn.Module:
    """The block with random weights: linear layers as PyTorch initialises them, norm weights
    (and biases) drawn around 1 (and 0) so that they are not the identity; on the meta
    device, no values at all."""
    block_class, config_class = BLOCKS[name]
    with torch.device(device):
        block = block_class(config_class())
    if torch.device(device).type != "meta":
        generator = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for module in block.modules():
                if isinstance(module, nn.Linear):
                    bound = 1 / math.sqrt(module.in_features)
                    module.weight.uniform_(-bound, bound, generator=generator)
                    if module.bias is not None:
                        module.bias.uniform_(-bound, bound, generator=generator)
                elif isinstance(module, (nn.LayerNorm, LlamaRMSNorm)):
                    module.weight.normal_(1.0, 0.1, generator=generator)
                    if getattr(module, "bias", None) is not None:
                        module.bias.normal_(0.0, 0.1, generator=generator)
    return block.to(dtype=dtype).eval()


def block_input(name: str, batch: int, seq: int, device, dtype=torch.bfloat16, seed: int = 1):
    shape = (batch, seq, BLOCKS[name][1]().hidden)
    if torch.device(device).type == "meta":
        return torch.empty(shape, device=device, dtype=dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device).to(dtype)


def relative_error(found, reference) -> float:
    """||found - reference|| / ||reference||, in float64."""
    found, reference = found.double(), reference.double()
    return float((found - reference).norm() / reference.norm())


def reference_output(name: str, x, block: nn.Module):
    """The block in float64, eagerly, from the same (rounded) weights and input."""
    import copy
    wide = copy.deepcopy(block).double()
    if name == "llama":   # the rotary tables are float32 in the block: recompute them in float64
        wide.cos, wide.sin = _rotary_tables(wide.config, wide.head_dim, x.device)
    with torch.no_grad():
        return wide(x.double())


def _rotary_tables(c: LlamaConfig, head_dim: int, device):
    inverse = 1.0 / c.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.outer(torch.arange(c.max_positions, dtype=torch.float64, device=device), inverse)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


# --- the bench ---------------------------------------------------------------------------

VARIANTS = ("eager", "inductor", "inductor-max-autotune", "aicg", "aicg-max-autotune")
MORE_VARIANTS = ("inductor-reduce-overhead", "aicg-reduce-overhead")    # by --variants only


def profile_text(batch: int, seq: int) -> str:
    """An instance with every operator in bfloat16 at the blocks' row shapes, and the matrix classes
    of their projections, each kernel chosen among four candidates a family as the default profile's
    are (with two, the Llama block's seven matmuls at 512 rows took 433 us of GPU time a forward
    against cuBLAS's 319-335)."""
    rows = batch * seq
    return (f'[instance]\nname = "model-bench"\ntarget = "nvidia-h200"\npreservation = "tolerance"\n\n'
            f"[plan]\ncandidates_per_family = 4\n\n[validation]\ntiming_repetitions = 5\n\n"
            f'[[workload]]\nops = ["rmsnorm", "residual_rmsnorm", "row_sum", "row_max"]\ndtypes = ["bfloat16"]\n'
            f"shapes = [[{rows}, {LlamaConfig.hidden}]]\n\n"
            f'[[workload]]\nops = ["layernorm", "bias_gelu_residual"]\ndtypes = ["bfloat16"]\n'
            f"shapes = [[{rows}, {GPT2Config.hidden}]]\n\n"
            f'[[workload]]\nops = ["softmax", "log_softmax"]\ndtypes = ["bfloat16"]\n'
            f"shapes = [[{batch * GPT2Config.heads * seq}, {seq}]]\n" + matmul_entries(rows))


def build_instance(work: Path, batch: int, seq: int) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from doit_project import doit, instance_dir, make_project
    from aicg import target as targets
    profile = profile_text(batch, seq)
    if not (work / "dodo.py").exists():
        work.mkdir(parents=True, exist_ok=True)
        make_project(work, profile)
    (work / "rulesets/profiles/small.toml").write_text(profile)
    run = doit(work, "build", "profile=rulesets/profiles/small.toml", "target=auto")
    if run.code != 0:
        raise SystemExit(f"building the instance failed:\n{run.output[-4000:]}")
    hardware, reason = targets.gpu_target(work / "hwdb", targets.present_device())
    if hardware is None:
        raise SystemExit(reason)
    return instance_dir(work, hardware.target)


def compiled(variant: str, block: nn.Module, instance):
    """The block run as `variant` says: eager, or Inductor or aicg.backend, with Inductor's mode
    after a dash (inductor-max-autotune, aicg-reduce-overhead: CUDA graphs, no host time a launch)."""
    import aicg
    if variant == "eager":
        return block, None
    compiler, _, mode = variant.partition("-")
    if compiler == "inductor":
        return torch.compile(block, mode=mode or None), None
    backend = aicg.backend(instance, mode=mode or None)
    return torch.compile(block, backend=backend), backend


def time_forward(run, x, reps: int, repeats: int = 5) -> list[float]:
    """Milliseconds a forward, the median of `reps` launches back to back, `repeats` times."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            run(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return times


def host_ms(run, x, calls: int = 10) -> float:
    """Host time a forward (Python, dispatch, launches), the forwards queued behind a GPU sleep long
    enough that none waits for the device: where it exceeds the GPU's time, the host sets the pace."""
    torch.cuda.synchronize()
    torch.cuda._sleep(HOST_SLEEP_CYCLES)
    begin = time.perf_counter()
    for _ in range(calls):
        run(x)
    seconds = (time.perf_counter() - begin) / calls
    torch.cuda.synchronize()
    return 1e3 * seconds


def _device_us(event) -> float:
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)))


def profile_forward(run, x, reps: int = 5, top: int = 12) -> dict:
    """Where a forward's time goes (torch.profiler over `reps` forwards, per forward): the GPU
    kernels' time in all and the longest kernels, and the host operators with the most time of
    their own."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run(x)
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if _device_us(e) > 0 and e.self_cpu_time_total == 0]
    host = sorted((e for e in events if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)
    return {"gpu_us": sum(_device_us(e) for e in kernels) / reps,
            "kernels": [{"name": e.key[:120], "calls": e.count / reps, "us": _device_us(e) / reps}
                        for e in sorted(kernels, key=lambda e: -_device_us(e))[:top]],
            "host_ops": [{"name": e.key[:120], "calls": e.count / reps, "self_us": e.self_cpu_time_total / reps}
                         for e in host[:top]]}


def bench_block(name: str, instance, variants, batch: int, seq: int, reps: int, profiled: bool = False,
                save=lambda result: None) -> dict:
    """The block's figures for each variant; `save(result so far)` after each one."""
    device = torch.device("cuda")
    block, x = make_block(name, device), block_input(name, batch, seq, device)
    reference = reference_output(name, x, block)
    result = {"config": asdict(block.config), "batch": batch, "seq": seq, "dtype": "bfloat16", "variants": {}}
    for variant in variants:
        torch._dynamo.reset()
        run, backend = compiled(variant, block, instance)
        with torch.no_grad():
            started = time.perf_counter()
            y = run(x)
            torch.cuda.synchronize()
            first_call = time.perf_counter() - started
            for _ in range(3):   # warm-up: CUDA graphs record on a later call
                y = run(x)
            error = relative_error(y, reference)   # now: a CUDA graph's next replay overwrites y
            times = time_forward(run, x, reps)
            entry = {"median_ms": statistics.median(times), "times_ms": times, "first_call_s": first_call,
                     "relative_error": error, "host_ms": host_ms(run, x)}
            if profiled:
                entry["profile"] = profile_forward(run, x)
        if backend is not None:
            entry["replaced"] = backend.counts()
            entry["reports"] = [r.as_record() for r in backend.reports]
        result["variants"][variant] = entry
        save(result)
        print(f"{name:6s} {variant:22s} {entry['median_ms']:9.3f} ms  host {entry['host_ms']:7.3f} ms  "
              f"first call {first_call:7.1f} s  "
              f"error {entry['relative_error']:.2e}  {entry.get('replaced', '')}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--instance", type=Path, help="an instance to use (default: build one in --work)")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "model-bench-project")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--blocks", default=",".join(BLOCKS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--profile", action="store_true",
                        help="also where each forward's time goes (torch.profiler: GPU kernels, host operators)")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS) - set(MORE_VARIANTS)) + sorted(set(args.blocks.split(",")) - set(BLOCKS))
    if unknown:
        raise SystemExit(f"unknown variant or block: {', '.join(unknown)}")
    import aicg
    started = time.perf_counter()
    path = args.instance or build_instance(args.work, args.batch, args.seq)
    instance = aicg.load(path)
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "instance": str(path),
              "instance_name": instance.manifest.get("instance"), "build_s": time.perf_counter() - started,
              "blocks": {}}
    def save(name: str, result: dict) -> None:   # what was measured so far survives a stop
        record["blocks"][name] = result
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    for name in args.blocks.split(","):
        bench_block(name, instance, variants, args.batch, args.seq, args.reps, args.profile,
                    save=lambda result, name=name: save(name, result))
    record["total_s"] = time.perf_counter() - started
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.json} ({record['total_s']:.0f} s)")


if __name__ == "__main__":
    main()
