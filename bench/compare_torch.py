#!/usr/bin/env python3
"""attnops against PyTorch on the CPU, measured in one run.

Runs `attnops bench --json` for the chosen workloads, then the same workloads through PyTorch:
  - attention with torch.nn.functional.scaled_dot_product_attention (BNSD tensors; GQA through
    enable_gqa; causal through is_causal, which for equal query and key lengths is the same
    mask as sparse mode 3). A packed TND batch becomes the per-sequence loop a user would write
    (slice, SDPA, concatenate); its backward is one autograd call over that loop's graph.
  - Block Attention Residuals in its PyTorch form: stack the sources, RMSNorm, einsum with the
    projection, softmax over the sources, einsum with the values.
  - a paged decode step (FusedInferAttentionScore decode workloads) the way a PyTorch user
    writes it: gather the pages of every request through the block table, dequantise an int8
    cache with its per-channel scales, then SDPA of the one query row against the gathered keys
    (decode MLA: one [k_nope ; k_pe] cache, the value its first D dims).
Both sides time the same thing: the forward call, or the backward call alone (PyTorch: autograd
over a graph built once, attnops: FlashAttentionScoreGrad given the forward's outputs), median of
repeated runs after a warm-up, with the same number of threads.

The two sides are measured back to back, row by row: for each workload, dtype and direction,
--rounds times (default 2) attnops (`attnops bench` for that row alone, in its own process, as
before) then PyTorch, and each side's time is the median over its rounds' medians. On a shared
or noisy host (a VM whose neighbours come and go) the speed of the machine drifts from minute to
minute; measuring all of attnops first and all of PyTorch minutes later let that drift into the
ratio (on the 2-vCPU AMD EPYC Zen 3 VM the same attnops row once took 212 ms and, four minutes
later, 454 ms). --rounds 0 keeps the old order (one attnops run of every row first).

It prints one line per workload, dtype and direction with both times, both rates and the
speed-up (PyTorch time / attnops time); --json saves everything, --plot draws TFLOP/s against
sequence length for the --sweep workloads.

  pip install torch matplotlib
  python3 bench/compare_torch.py --plot bench/results/<machine>/sdpa-vs-attnops.png \
      --json bench/results/<machine>/compare_torch.json   (<machine>: a slug naming the CPU)
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attnops", default=os.path.join(ROOT, "build", "tools", "cli", "attnops"),
                    help="the attnops binary (built with CMake Release if it is missing)")
    ap.add_argument("--workloads", default="", help="comma-separated names or prefixes (attnops bench --list)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma separated: fp32, bf16, fp16")
    ap.add_argument("--directions", default="fwd,bwd")
    ap.add_argument("--sweep", default="", help="sequence lengths for the BNSD N=16 D=128 sweep (e.g. 512,1024,2048,4096)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="threads for both (default: attnops' usable cores)")
    ap.add_argument("--quick", action="store_true", help="shapes / 8 (a smoke run)")
    ap.add_argument("--max-seconds", type=float, default=60.0,
                    help="stop repeating a PyTorch case after this much time (slow per-sequence loops)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds per row of attnops then PyTorch back to back (0: every attnops row first)")
    ap.add_argument("--json", default="", help="write the combined results here")
    ap.add_argument("--plot", default="", help="PNG of TFLOP/s against sequence length (needs --sweep)")
    return ap.parse_args()


def ensure_binary(path):
    if os.path.exists(path):
        return path
    build = os.path.join(ROOT, "build")
    print(f"building {path} ...", flush=True)
    subprocess.run(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"], check=True)
    subprocess.run(["cmake", "--build", build, "--target", "attnops_cli"], check=True)
    return path


def run_attnops(args, row=None):
    """`attnops bench --json` over the selected rows (with the peaks), or over one row (no peaks)."""
    dtypes, directions, workloads = args.dtypes, args.directions, args.workloads
    if row is not None:
        dtypes, directions, workloads = row["dtype"], row["direction"], row["workload"]
    cmd = [ensure_binary(args.attnops), "bench", "--json", "--repeat", str(args.repeat),
           "--dtypes", dtypes, "--directions", directions]
    if workloads:
        cmd += ["--workloads", workloads]
    if args.sweep:
        cmd += ["--sweep", args.sweep]
    if args.quick:
        cmd.append("--quick")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if row is not None:
        cmd.append("--no-peaks")
    else:
        if args.rounds > 0:  # this run gives the peaks and the rows; the rounds time them
            cmd[cmd.index("--repeat") + 1] = "1"
            cmd += ["--warmup", "0"]
        print("$ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    doc = json.loads(out)
    if row is None:
        return doc
    # The workload names are prefixes of one another (mla-decode-...-h16, ...-h16-int8): take this row's.
    same = [r for r in doc["results"] if (r["workload"], r["dtype"], r["direction"]) ==
            (row["workload"], row["dtype"], row["direction"])]
    if len(same) != 1:
        raise RuntimeError(f"attnops bench gave {len(same)} results for {row['workload']} {row['dtype']} {row['direction']}")
    return same[0]


def timed(fn, repeat, max_seconds):
    fn()  # warm-up
    times = []
    start = time.perf_counter()
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() - start > max_seconds:
            break
    return times


class TorchCase:
    """One workload as PyTorch code: build(dtype) then forward() / backward()."""

    def __init__(self, torch, problem, dtype, backward):
        self.torch, self.p, self.backward_mode = torch, problem, backward
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        g = torch.Generator().manual_seed(1)
        self.rand = lambda *shape: (torch.rand(*shape, generator=g) * 2 - 1).to(self.dtype)
        if problem["op"] == "block-attention-residuals":
            self._build_bar()
        elif problem["op"] == "fused-infer-attention-decode":
            self._build_decode(g)
        else:
            self._build_attention()

    # ---- attention
    def _build_attention(self):
        p, torch = self.p, self.torch
        n1, n2, d = p["heads"], p["kvHeads"], p["dim"]
        self.causal, self.scale, self.gqa = p["causal"], p["scale"], n1 != n2
        if p["layout"] == "TND":
            lens = p["seqLens"]
            t = sum(lens)
            self.q, self.k, self.v = self.rand(t, n1, d), self.rand(t, n2, d), self.rand(t, n2, d)
            self.starts = [0]
            for length in lens:
                self.starts.append(self.starts[-1] + length)
        else:
            b, s1, s2 = p["batch"], p["qSeqLen"], p["kvSeqLen"]
            self.q, self.k, self.v = self.rand(b, n1, s1, d), self.rand(b, n2, s2, d), self.rand(b, n2, s2, d)
            self.starts = None
        self.inputs = (self.q, self.k, self.v)

    def _sdpa(self, q, k, v):
        F = self.torch.nn.functional
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale, enable_gqa=self.gqa)

    def _attention(self):
        if self.starts is None:
            return self._sdpa(*self.inputs)
        # The loop a user writes for a packed batch. torch.split, not q[a:b]: the backward of one
        # split is one concatenation, while every slice's backward would materialise a zero
        # tensor of the whole batch (quadratic in the number of sequences).
        lens = [b - a for a, b in zip(self.starts, self.starts[1:])]
        outs = [self._sdpa(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)
                for q, k, v in zip(*(x.split(lens) for x in self.inputs))]
        return self.torch.cat(outs, 0)

    # ---- Block Attention Residuals (the paper's PyTorch form)
    def _build_bar(self):
        p = self.p
        t, n, h = p["tokens"], p["blocks"], p["hidden"]
        self.eps = p["eps"]
        self.inputs = (self.rand(t, h), self.rand(t, n, h), self.rand(h) * 0.1, 1 + self.rand(h) * 0.1)

    def _bar(self):
        torch = self.torch
        partial, block_res, proj_weight, norm_weight = self.inputs
        sources = torch.cat([block_res, partial.unsqueeze(1)], dim=1)  # [T, N+1, H]
        keys = torch.nn.functional.rms_norm(sources, (sources.shape[-1],), weight=norm_weight, eps=self.eps)
        logits = torch.einsum("tkh,h->tk", keys, proj_weight)
        probs = torch.softmax(logits.float(), dim=-1).to(sources.dtype)
        return torch.einsum("tk,tkh->th", probs, sources)

    # ---- paged decode: a BnNBsD cache (blocks, KV_N, block size, D), or for the BnBsH workloads
    # (blocks, block size, KV_N, D) as vLLM and flash-attn page it, in shuffled physical order
    def _build_decode(self, g):
        p, torch = self.p, self.torch
        b, n1, n2, d, bs = p["batch"], p["heads"], p["kvHeads"], p["dim"], p["blockSize"]
        self.context = p["kvLens"][0]  # the decode workloads give every request the same context
        assert all(length == self.context for length in p["kvLens"])
        per_request = -(-self.context // bs)
        blocks = b * per_request
        self.table = torch.randperm(blocks, generator=g).reshape(b, per_request)
        self.int8 = p["kvDtype"] == "int8"
        self.bsh = p.get("cache") == "BnBsH" and not p.get("ropeDim", 0)  # (MLA: one kv head, the same either way)
        shape = (blocks, bs, n2, d) if self.bsh else (blocks, n2, bs, d)
        if self.int8:
            cache = lambda: torch.randint(-127, 128, shape, dtype=torch.int8, generator=g)
            self.k_scale, self.v_scale = self.rand(1, n2, 1, d) * 0.01, self.rand(1, n2, 1, d) * 0.01
        else:
            cache = lambda: self.rand(*shape)
        # MLA (ropeDim > 0): one cache of [k_nope ; k_pe] rows, whose first D dims are the value.
        self.rope = p.get("ropeDim", 0)
        if self.rope and self.int8:  # MLA full quant: int8 query and key cache, bf16 ropes beside them
            self.k_cache = torch.randint(-127, 128, (blocks, n2, bs, d), dtype=torch.int8, generator=g)
            self.rope_cache = self.rand(blocks, n2, bs, self.rope)
            self.q8 = torch.randint(-127, 128, (b, n1, 1, d), dtype=torch.int8, generator=g)
            self.q_scale = torch.rand(b, n1, 1, 1, generator=g) * 0.01  # per token and head
            self.q_pe = self.rand(b, n1, 1, self.rope)
            self.k_scale, self.v_scale = 0.01, 0.02  # per tensor
            self.scale = 1.0 / math.sqrt(d + self.rope)
            return
        if self.rope:
            self.k_cache = self.v_cache = self.rand(blocks, n2, bs, d + self.rope)
            self.q = self.rand(b, n1, 1, d + self.rope)
            self.scale = 1.0 / math.sqrt(d + self.rope)
            return
        self.k_cache, self.v_cache = cache(), cache()
        self.q = self.rand(b, n1, 1, d)
        self.scale = 1.0 / math.sqrt(d)

    def _gather(self, cache, scale):
        b, per_request = self.table.shape
        pages = cache[self.table]  # (B, blocks per request, KV_N, block size, D); BnBsH: (..., block size, KV_N, D)
        if self.bsh:
            x = pages.permute(0, 3, 1, 2, 4).reshape(b, cache.shape[2], per_request * cache.shape[1], cache.shape[3])
        else:
            x = pages.permute(0, 2, 1, 3, 4).reshape(b, cache.shape[1], per_request * cache.shape[2], cache.shape[3])
        x = x[:, :, :self.context]
        return (x.to(self.dtype) * scale) if scale is not None else x

    def _decode(self):
        if self.rope and self.int8:  # MLA full quant: dequantise, then SDPA over [k ; k_pe], value = k
            k8 = self._gather(self.k_cache, None).to(self.dtype)
            k = self.torch.cat([k8 * self.k_scale, self._gather(self.rope_cache, None)], -1)
            q = self.torch.cat([(self.q8.to(self.torch.float32) * self.q_scale).to(self.dtype), self.q_pe], -1)
            F = self.torch.nn.functional
            return F.scaled_dot_product_attention(q, k, k8 * self.v_scale, scale=self.scale, enable_gqa=True)
        k = self._gather(self.k_cache, self.k_scale if self.int8 else None)
        if self.rope:  # MLA: the value is the key's first D dims
            v = k[..., :k.shape[-1] - self.rope]
        else:
            v = self._gather(self.v_cache, self.v_scale if self.int8 else None)
        F = self.torch.nn.functional
        return F.scaled_dot_product_attention(self.q, k, v, scale=self.scale, enable_gqa=True)

    # ---- timing entry points
    def _run(self):
        if self.p["op"] == "block-attention-residuals":
            return self._bar()
        if self.p["op"] == "fused-infer-attention-decode":
            return self._decode()
        return self._attention()

    def forward(self):
        with self.torch.no_grad():
            self._run()

    def prepare_backward(self):
        self.inputs = tuple(x.detach().requires_grad_(True) for x in self.inputs)
        self.out = self._run()
        self.dy = self.rand(*self.out.shape)

    def backward(self):
        self.torch.autograd.grad(self.out, self.inputs, self.dy, retain_graph=True)


def main():
    args = parse_args()
    import torch

    doc = run_attnops(args)
    threads = args.threads or doc["threads"]
    torch.set_num_threads(threads)
    print(f"PyTorch {torch.__version__}, {threads} threads; attnops on {doc['cpu']}")
    if args.rounds > 0:
        print(f"each row: {args.rounds} rounds of attnops then PyTorch back to back, median over the rounds")
    else:
        print("every attnops row first, then every PyTorch row")
    print(f"{'workload':<28} {'dtype':<5} {'dir':<4} {'attnops':>11} {'PyTorch':>11} {'attnops rate':>15} "
          f"{'PyTorch rate':>15} {'speed-up':>9}")
    rows = []
    for r in doc["results"]:
        backward = r["direction"] == "bwd"
        attnops_rounds, torch_rounds, error = [], [], None
        try:
            case = TorchCase(torch, r["problem"], r["dtype"], backward)
            if backward:
                case.prepare_backward()
        except Exception as e:  # e.g. a dtype PyTorch's CPU kernels lack
            case, error = None, f"{type(e).__name__}: {e}"
        for _ in range(max(args.rounds, 1)):
            attnops_rounds.append(run_attnops(args, r)["medianMs"] if args.rounds > 0 else r["medianMs"])
            if case is None:
                continue
            try:
                times = timed(case.backward if backward else case.forward, args.repeat, args.max_seconds)
                torch_rounds.append(statistics.median(times))
            except Exception as e:
                case, error = None, f"{type(e).__name__}: {e}"
        case = None  # free PyTorch's tensors before the next row
        r["medianMs"] = statistics.median(attnops_rounds)
        torch_ms = statistics.median(torch_rounds) if torch_rounds and error is None else None
        work = r.get("flops", r.get("bytes"))
        unit, scale = ("TFLOP/s", 1e12) if "flops" in r else ("GB/s", 1e9)
        attnops_rate = work / (r["medianMs"] * 1e-3) / scale
        torch_rate = work / (torch_ms * 1e-3) / scale if torch_ms else None
        speedup = torch_ms / r["medianMs"] if torch_ms else None
        row = dict(workload=r["workload"], dtype=r["dtype"], direction=r["direction"],
                   implementation=r["implementation"], problem={k: v for k, v in r["problem"].items() if k != "seqLens"},
                   attnopsMs=r["medianMs"], torchMs=torch_ms, unit=unit, attnopsRate=attnops_rate,
                   torchRate=torch_rate, speedup=speedup, torchError=error,
                   attnopsRoundsMs=attnops_rounds, torchRoundsMs=torch_rounds)
        rows.append(row)
        fmt_rate = lambda x: f"{x:.3f} {unit}" if x is not None and unit == "TFLOP/s" else (
            f"{x:.1f} {unit}" if x is not None else "-")
        print(f"{r['workload']:<28} {r['dtype']:<5} {r['direction']:<4} {r['medianMs']:>9.1f}ms "
              + (f"{torch_ms:>9.1f}ms" if torch_ms else f"{'failed':>11}")
              + f" {fmt_rate(attnops_rate):>15} {fmt_rate(torch_rate):>15} "
              + (f"{speedup:>8.2f}x" if speedup else f"  ({error})"), flush=True)
    result = dict(cpu=doc["cpu"], threads=threads, torch=torch.__version__, peaks=doc["peaks"],
                  repeat=args.repeat, rounds=args.rounds, quick=args.quick, rows=rows)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    if args.plot:
        plot(result, args.plot)


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = [r for r in result["rows"] if r["workload"].startswith("sweep-")]
    if not sweep:
        print("--plot: no sweep workloads (pass --sweep)", file=sys.stderr)
        return
    series = sorted({(r["dtype"], r["direction"]) for r in sweep})
    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 4), squeeze=False)
    for ax, (dtype, direction) in zip(axes[0], series):
        pts = sorted((r["problem"]["qSeqLen"], r) for r in sweep if r["dtype"] == dtype and r["direction"] == direction)
        s = [x for x, _ in pts]
        ax.plot(s, [r["attnopsRate"] for _, r in pts], "o-", label="attnops")
        ax.plot(s, [r["torchRate"] or math.nan for _, r in pts], "s--", label="PyTorch SDPA")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length S (BNSD B=1 N=16 D=128, no mask)")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{dtype} {'forward' if direction == 'fwd' else 'backward'}")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"{result['cpu']}, {result['threads']} threads, PyTorch {result['torch']}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
