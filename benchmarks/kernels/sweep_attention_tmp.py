import itertools, torch
from triton.testing import do_bench
import atom_kernels as ak
from atom_kernels import attention

BF16 = torch.bfloat16
def rand(*s): return torch.randn(*s, device="cuda", dtype=BF16)
def cu(l): return torch.tensor([0, *torch.tensor(l).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
base = attention.attention_config

def run(name, fn, cands, decode):
    for c in cands:
        cfg = dict(zip(["BLOCK_M", "BLOCK_N", "num_warps", "num_stages"], c))
        attention.attention_config = lambda d, h, heads, cfg=cfg: (dict(cfg, BLOCK_M=max(cfg["BLOCK_M"], heads)) if d == decode else base(d, h, heads))
        try:
            ms = do_bench(fn, warmup=5, rep=30, return_mode="median")
            print(f"{name} {c}: {ms*1e3:.1f} us", flush=True)
        except Exception as e:
            print(f"{name} {c}: {type(e).__name__} {str(e)[:100]}", flush=True)
    attention.attention_config = base

L = [2048] * 4
q, k, v = rand(8192, 32, 128), rand(8192, 4, 128), rand(8192, 4, 128)
c = cu(L)
pre = [(128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3), (256, 64, 8, 2), (128, 32, 4, 4)]
run("prefill", lambda: ak.varlen_attention(q, k, v, c, c, 0.088, True), pre, False)
seq = [4096] * 8
nb = 8 * 256
kc, vc = rand(nb, 16, 8, 128), rand(nb, 16, 8, 128)
table = torch.randperm(nb, device="cuda").view(8, 256).int()
qe = rand(8 * 512, 32, 128)
lens = torch.tensor(seq, device="cuda", dtype=torch.int32)
run("extend", lambda: ak.paged_attention(qe, kc, vc, cu([512] * 8), lens, table, 0.088), pre, False)
seq = [4096] * 64
nb = 64 * 256
kc, vc = rand(nb, 16, 8, 128), rand(nb, 16, 8, 128)
table = torch.randperm(nb, device="cuda").view(64, 256).int()
qd = rand(64, 32, 128)
lens = torch.tensor(seq, device="cuda", dtype=torch.int32)
dec = [(16, 64, 4, 2), (16, 64, 4, 3), (16, 128, 4, 2), (16, 128, 8, 3), (16, 32, 4, 3), (16, 64, 2, 3)]
run("decode", lambda: ak.paged_attention(qd, kc, vc, cu([1] * 64), lens, table, 0.088), dec, True)
