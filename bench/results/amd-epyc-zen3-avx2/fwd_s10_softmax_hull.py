# Softmax elements (key x query-row lanes) the forward reads per credited pair, before (every key of a partly masked
# block) and after (each 8-row vector's hull of kept keys), causal sq == skv, 120-row units, 128-key blocks.
from fwd_s10_block_work import lengths
QR,KR,L=120,128,8
def count(Ls):
    cr=before=after=0
    for S in Ls:
        cr+=S*(S+1)//2
        for q0 in range(0,S,QR):
            q1=min(S,q0+QR); rows=q1-q0
            for k0 in range(0,q1,KR):
                nk=min(KR,q1-k0); full=k0+nk<=q0+1
                for r0 in range(0,rows,L):
                    lanes=L  # vectors are whole 8-row lanes
                    before+=nk*lanes
                    if full: after+=nk*lanes; continue
                    hi=min(q0+min(rows,r0+L),k0+nk)-k0  # keys kept by some row of the vector: [0, last row + 1)
                    after+=max(0,hi)*lanes
    return cr,before,after
for name,Ls in (("causal S=2048",[2048]),("TND 32K",lengths(32768))):
    cr,b,a=count(Ls); print(f"{name}: softmax lanes per credited pair {b/cr:.4f} before, {a/cr:.4f} after")
