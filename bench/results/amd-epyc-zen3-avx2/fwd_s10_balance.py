# 2-thread dynamic claiming of the forward's chunks (plan.cpp partitionUnits: chunks of ~total/(threads*16) cost in unit
# order, claimed in index order) with the plan's cost model (rows x keys + 64 per unit, times the group); idle tail =
# makespan / (total / threads) - 1. Variants: index order (now), descending unit cost with chunks cut the same way.
import heapq
from fwd_s10_block_work import lengths
QR=120
def units(lens, n2, group):
    U=[]
    for S in lens:
        for h in range(n2):
            for q0 in range(0,S,QR):
                q1=min(S,q0+QR); U.append(group*((q1-q0)*q1+64))
    return U
def chunks(U, threads, per=16):
    tot=sum(U); target=max(1,tot/(threads*per)); C=[]; run=0
    for c in U:
        run+=c
        if run>=target: C.append(run); run=0
    if run: C.append(run)
    return C
def makespan(C, threads):
    h=[0.0]*threads
    for c in C: t=heapq.heappop(h); heapq.heappush(h,t+c)
    return max(h)
def report(name, U, threads=2):
    tot=sum(U)
    for label, order in (("index order", U), ("descending unit cost", sorted(U, reverse=True))):
        for per in (16,64):
            C=chunks(order,threads,per); ms=makespan(C,threads)
            print(f"{name} {threads} threads, {label}, {per} chunks/thread: {len(C)} chunks, makespan/ideal = {ms/(tot/threads):.4f}")
    ms=makespan(sorted(U,reverse=True),threads); print(f"{name} {threads} threads, units one by one, descending: {ms/(tot/threads):.4f}")
if __name__ == '__main__':
    report("GQA 32/8 S=2048 causal", units([2048],8,4))
    report("TND 32K N1=16 N2=4", units(lengths(32768),4,4))
    report("BNSD N=16 S=2048 dense-ish causal", units([2048],16,1))
