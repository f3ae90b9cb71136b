# flash-attn's flash_attn_with_kvcache (attnops.torch) on BnBsH-style pages, the way a PyTorch
# user decodes: B=32 requests x 4,096 cached tokens, GQA 32/8, D 128, bf16, 128-token pages in a
# shuffled block table; median of 10 calls after 2, and whether the cache got huge pages
# (PyTorch's THP_MEM_ALLOC_ENABLE=1 puts large tensors on them). Run with the project's .venv
# after `pip install .`:
#   .venv/bin/python bench/results/intel-xeon-amx/flash_attn_kvcache_decode.py
#   THP_MEM_ALLOC_ENABLE=1 .venv/bin/python bench/results/intel-xeon-amx/flash_attn_kvcache_decode.py
# Intel(R) Xeon(R) Processor, GenuineIntel family 6 model 167 as its KVM guest reported it,
# 2 threads, PyTorch 2.15, 2026-12-07 (seventh AMX session, NOTES.md), runs interleaved:
#   before the units of several kv heads (41d51bf): 61.0-63.1 ms (8.5-8.8 GB/s), with
#     THP_MEM_ALLOC_ENABLE=1 63.0-63.8 ms (huge pages confirmed);
#   8-head units with 128-key blocks (5baa221): 55.9-58.9 ms, with THP 56.2-62.6;
#   with 64-key blocks (d57a808): 38.9-40.1 ms (13.4-13.8 GB/s).
import os, time, statistics, torch, attnops.torch as at
torch.manual_seed(0)
B, S, H, HK, D, BS = 32, 4096, 32, 8, 128, 128
nb = B * S // BS
k = torch.randn(nb, BS, HK, D, dtype=torch.bfloat16)
v = torch.randn(nb, BS, HK, D, dtype=torch.bfloat16)
table = torch.randperm(nb, dtype=torch.int32).reshape(B, S // BS)
q = torch.randn(B, 1, H, D, dtype=torch.bfloat16)
lens = torch.full((B,), S, dtype=torch.int32)
def hp(t):
    addr = t.data_ptr()
    import re
    cur = False
    for line in open('/proc/self/smaps'):
        m = re.match(r'^([0-9a-f]+)-([0-9a-f]+) ', line)
        if m: cur = int(m.group(1), 16) <= addr < int(m.group(2), 16)
        elif cur and line.startswith('AnonHugePages'): return line.split()[1] + ' kB'
for _ in range(2): at.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table)
ts = []
for _ in range(10):
    t0 = time.perf_counter(); at.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table); ts.append(time.perf_counter() - t0)
m = statistics.median(ts)
print(f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '')!r:5} huge pages of k: {hp(k)}; median {m*1e3:.2f} ms, {2*k.numel()*2/m/1e9:.1f} GB/s, threads {torch.get_num_threads()}")
