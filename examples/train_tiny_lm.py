"""Train a tiny decoder-only byte-level language model on CPU with attnops.

The model packs documents of different lengths into one token stream (TND layout) and runs
causal attention inside each document with attnops' FlashAttentionScore (``npu_fusion_attention``
with ``actual_seq_qlen``), and mixes the outputs of earlier blocks with Block Attention Residuals
(Kimi Team, "Attention Residuals", arXiv 2603.15031) instead of a plain residual sum.

The text is the source code of Python's own standard library (no download). Modes:

    python examples/train_tiny_lm.py                  # attnops, 300 steps, prints the falling loss
    python examples/train_tiny_lm.py --impl torch     # the same model in plain PyTorch
    python examples/train_tiny_lm.py --compare 20     # both from the same initialisation and data:
                                                      # losses side by side, time per step, speed-up
    torchrun --nproc_per_node W examples/train_tiny_lm.py --context-parallel W
                                                      # context parallelism over W processes (gloo):
                                                      # every document sharded over the ranks

Plain PyTorch has no packed variable-length attention, so its attention takes the usual route:
one [T,T] score matrix per head with a block-diagonal causal mask. Block Attention Residuals in
plain PyTorch is the paper's form (stack, RMSNorm, softmax over sources, weighted sum).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sysconfig
import time

# PyTorch's OpenMP threads spin after each parallel region by default and then compete with
# attnops' worker threads for the cores. Waiting passively gives the cores back: on the 2-core
# development machine under load this took a step from 1070 ms to 190 ms. Must be set before
# torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnops.torch as at  # noqa: E402

# The compressed causal mask torch_npu users pass with sparse modes 2-4 (a None mask means no masking).
CAUSAL = torch.ones(2048, 2048, dtype=torch.bool).triu(1)


# ---------------------------------------------------------------------------------------------
# Data: bytes of the standard library's .py files, cut into documents of random lengths.


def load_corpus(max_bytes: int = 3_000_000) -> list[bytes]:
    root = sysconfig.get_paths()["stdlib"]
    docs, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "site-packages", "idlelib"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name), "rb") as f:
                    text = f.read()
                if len(text) > 512:
                    docs.append(text)
                    total += len(text)
        if total >= max_bytes:
            break
    return docs


def sample_batch(docs: list[bytes], tokens: int, rng: random.Random, min_len=24, max_len=320, multiple=1):
    """A packed batch: inputs and targets [T] plus the document lengths (each a causal sequence),
    every length a multiple of `multiple` (tokens must be one too)."""
    xs, ys, lens = [], [], []
    left = tokens
    while left > 0:
        n = min(rng.randint(min_len, max_len), left)
        n -= n % multiple
        doc = docs[rng.randrange(len(docs))]
        start = rng.randrange(len(doc) - n - 1)
        chunk = doc[start:start + n + 1]
        xs.append(torch.frombuffer(bytearray(chunk[:-1]), dtype=torch.uint8))
        ys.append(torch.frombuffer(bytearray(chunk[1:]), dtype=torch.uint8))
        lens.append(n)
        left -= n
    return torch.cat(xs).long(), torch.cat(ys).long(), lens


# ---------------------------------------------------------------------------------------------
# Model


def bar_torch(partial, block_res, proj_weight, norm_weight, eps=1e-6):
    """Block Attention Residuals in the paper's PyTorch form (partial block last)."""
    v = torch.cat([block_res, partial[:, None]], dim=1)
    k = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
    p = torch.einsum("h,tnh->tn", proj_weight.reshape(-1), k).softmax(-1)
    return torch.einsum("tn,tnh->th", p, v)


def attention_torch(q, k, v, lens, scale):
    """Causal attention inside each packed document: dense [N,T,T] scores with a block-diagonal
    causal mask, softmax, matmul."""
    t = q.shape[0]
    doc = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    pos = torch.arange(t)
    allowed = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    s = torch.einsum("tnd,snd->nts", q, k) * scale
    p = s.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("nts,snd->tnd", p, v)


class Residuals(torch.nn.Module):
    """One Block Attention Residuals call site: a pseudo-query (zero at start, so the first
    steps average the sources) and an RMSNorm gain."""

    def __init__(self, dim, fused):
        super().__init__()
        self.fused = fused
        self.proj = torch.nn.Parameter(torch.zeros(1, dim))
        self.norm = torch.nn.Parameter(torch.ones(dim))

    def forward(self, blocks, partial):
        if partial is None:  # first sub-layer of a block: the newest completed block is "partial"
            blocks, partial = blocks[:-1], blocks[-1]
        if not blocks:        # only the embedding: a softmax over one source is that source
            return partial
        res = torch.stack(blocks, dim=1)  # [T, N, H]
        if self.fused:
            return at.block_attention_residuals(partial, res, self.proj, self.norm)
        return bar_torch(partial, res, self.proj, self.norm)


class Attention(torch.nn.Module):
    def __init__(self, dim, heads, fused):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.context_parallel = False  # True: x holds this rank's share of every document
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x, lens, cu):
        t, dim = x.shape
        d = dim // self.heads
        q, k, v = self.qkv(x).view(t, 3, self.heads, d).unbind(1)  # strided views, read in place
        if self.context_parallel:  # cu: the global document lengths; all-gather K/V
            a = at.cp.npu_fusion_attention(q, k, v, self.heads, "TND", scale=1 / math.sqrt(d), atten_mask=CAUSAL,
                                           sparse_mode=3, actual_seq_qlen=cu, actual_seq_kvlen=cu,
                                           comm="allgather")[0]
        elif self.fused:
            a = at.npu_fusion_attention(q, k, v, self.heads, "TND", scale=1 / math.sqrt(d), atten_mask=CAUSAL,
                                        sparse_mode=3, actual_seq_qlen=cu, actual_seq_kvlen=cu)[0]
        else:
            a = attention_torch(q, k, v, lens, 1 / math.sqrt(d))
        return self.out(a.reshape(t, dim))


class TinyLM(torch.nn.Module):
    def __init__(self, dim=128, heads=4, layers=4, layers_per_block=2, max_len=512, fused=True):
        super().__init__()
        self.layers_per_block = layers_per_block
        self.embed = torch.nn.Embedding(256, dim)
        self.position = torch.nn.Embedding(max_len, dim)  # position inside the document
        self.attn = torch.nn.ModuleList(Attention(dim, heads, fused) for _ in range(layers))
        self.mlp = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                                           torch.nn.Linear(4 * dim, dim)) for _ in range(layers))
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(dim, eps=1e-6) for _ in range(2 * layers + 1))
        self.res = torch.nn.ModuleList(Residuals(dim, fused) for _ in range(2 * layers + 1))
        self.head = torch.nn.Linear(dim, 256, bias=False)

    def forward(self, tokens, lens, shard=None):
        """tokens [T]; with `shard` (context parallelism) tokens are this rank's share and shard
        maps a global per-token tensor to it."""
        cu = torch.tensor(lens).cumsum(0).tolist()
        starts = torch.repeat_interleave(torch.tensor([0] + cu[:-1]), torch.tensor(lens))
        pos = torch.arange(sum(lens)) - starts
        if shard is not None:
            pos = shard(pos)
        blocks, partial = [self.embed(tokens) + self.position(pos)], None
        for i in range(len(self.attn)):
            for j, sub in enumerate((self.attn[i], self.mlp[i])):
                site = 2 * i + j
                h = self.norms[site](self.res[site](blocks, partial))
                out = sub(h, lens, cu) if j == 0 else sub(h)
                partial = out if partial is None else partial + out
            if (i + 1) % self.layers_per_block == 0:
                blocks.append(partial)
                partial = None
        return self.head(self.norms[-1](self.res[-1](blocks, partial)))


# ---------------------------------------------------------------------------------------------
# Training


def make_model(fused, seed):
    torch.manual_seed(seed)
    return TinyLM(fused=fused)


def step(model, opt, batch):
    x, y, lens = batch
    loss = F.cross_entropy(model(x, lens), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def train(args, docs):
    model = make_model(args.impl == "attnops", args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng = random.Random(args.seed)
    print(f"{args.impl}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
          f"{args.tokens} tokens per step in packed documents of 24..320 bytes")
    start, smooth = time.perf_counter(), None
    for i in range(1, args.steps + 1):
        loss = step(model, opt, sample_batch(docs, args.tokens, rng))
        smooth = loss if smooth is None else 0.9 * smooth + 0.1 * loss
        if i == 1 or i % args.every == 0 or i == args.steps:
            print(f"step {i:4d}  loss {loss:.3f}  (smoothed {smooth:.3f}, {math.exp(smooth):.1f} perplexity per byte)"
                  f"  {(time.perf_counter() - start) / i * 1000:.0f} ms/step")
    return model


def compare(args, docs):
    fused, plain = make_model(True, args.seed), make_model(False, args.seed)
    plain.load_state_dict(fused.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.01) for m in (fused, plain)]
    rng = random.Random(args.seed)
    times = [[], []]
    print("step  loss attnops  loss torch  |diff|    ms attnops  ms torch")
    for i in range(1, args.compare + 1):
        batch = sample_batch(docs, args.tokens, rng)
        losses = []
        for k, (m, o) in enumerate(zip((fused, plain), opts)):
            t0 = time.perf_counter()
            losses.append(step(m, o, batch))
            times[k].append(time.perf_counter() - t0)
        print(f"{i:4d}  {losses[0]:12.5f}  {losses[1]:10.5f}  {abs(losses[0] - losses[1]):.1e}"
              f"  {times[0][-1] * 1000:10.0f}  {times[1][-1] * 1000:8.0f}")
    med = [sorted(t[1:])[len(t[1:]) // 2] for t in times]  # median, first (warm-up) step left out
    print(f"median step: attnops {med[0] * 1000:.0f} ms, plain PyTorch {med[1] * 1000:.0f} ms "
          f"-> {med[1] / med[0]:.2f}x faster with attnops ({args.tokens} tokens, {torch.get_num_threads()} threads)")


# Document lengths are multiples of this under --context-parallel, so that the same batches run at
# W = 1, 2, 3, 4 (zigzag needs every length divisible by 2W).
CP_MULTIPLE = 24


def train_context_parallel(args, docs):
    """The attnops model under torchrun with W processes: every document sharded over the ranks
    (zigzag), attention by attnops.torch.cp (all-gather K/V), the rest per token. The loss is
    the mean over all tokens and the parameter gradients are summed over the ranks, so every
    rank takes the single-process run's steps (up to rounding)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != args.context_parallel:
        raise SystemExit(f"--context-parallel {args.context_parallel}: launched with {world} processes "
                         f"(torchrun --nproc_per_node {args.context_parallel})")
    threads = max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    import attnops
    attnops.set_threads(threads)
    model = make_model(True, args.seed)  # the same initialisation on every rank
    for m in model.attn:
        m.context_parallel = True
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    rng = random.Random(args.seed)  # the same batches on every rank
    tokens = args.tokens - args.tokens % CP_MULTIPLE
    if rank == 0:
        print(f"context parallel over {world} processes ({threads} threads each): {tokens} tokens per step, "
              f"documents of multiples of {CP_MULTIPLE} bytes")
    start = time.perf_counter()
    for i in range(1, args.steps + 1):
        x, y, lens = sample_batch(docs, tokens, rng, multiple=CP_MULTIPLE)
        cu = torch.tensor(lens).cumsum(0).tolist()

        def shard(t):
            return at.cp.shard(t, seq_dim=0, cu_seqlens=cu)

        logits = model(shard(x), lens, shard)
        loss = F.cross_entropy(logits, shard(y), reduction="sum") / tokens
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p_ in model.parameters():
            if p_.grad is not None:  # (unused parameters are unused on every rank)
                dist.all_reduce(p_.grad)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0 and (i == 1 or i % args.every == 0 or i == args.steps):
            print(f"step {i:4d}  loss {total.item():.6f}  {(time.perf_counter() - start) / i * 1000:.0f} ms/step",
                  flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=["attnops", "torch"], default="attnops")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--tokens", type=int, default=1024, help="tokens per step (packed documents)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, default=25, help="print every this many steps")
    p.add_argument("--compare", type=int, default=0, metavar="STEPS",
                   help="train attnops and plain-PyTorch models side by side for STEPS steps")
    p.add_argument("--context-parallel", type=int, default=0, metavar="W",
                   help="run under torchrun with W processes, every document sharded over them")
    args = p.parse_args()
    docs = load_corpus()
    if args.context_parallel:
        train_context_parallel(args, docs)
        return
    print(f"corpus: {len(docs)} files of Python's standard library, {sum(map(len, docs)) / 1e6:.1f} MB")
    if args.compare:
        compare(args, docs)
    else:
        train(args, docs)


if __name__ == "__main__":
    main()
