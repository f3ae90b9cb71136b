# Session 10 (fwd): executed vs credited score/PV pairs of the AVX2 forward (qr=120 rows, key blocks 128 from keys.lo), causal sq==skv.
import math, sys
M=(1<<64)-1
class Rng:
    def __init__(s,seed): s.st=(seed*0x9E3779B97F4A7C15+0x1234567)&M
    def next(s):
        s.st=(s.st+0x9E3779B97F4A7C15)&M; z=s.st
        z=((z^(z>>30))*0xBF58476D1CE4E5B9)&M; z=((z^(z>>27))*0x94D049BB133111EB)&M; return z^(z>>31)
    def uniform(s): return (s.next()>>11)*(1.0/9007199254740992.0)
def lengths(tokens):
    r=Rng(32768); L=[]; t=0
    while t<tokens:
        u1=1.0-r.uniform(); u2=r.uniform()
        n=math.sqrt(-2*math.log(u1))*math.cos(2*math.pi*u2)
        l=min(max(int(round(512*math.exp(0.8*n))),16),4096); l=min(l,tokens-t); L.append(l); t+=l
    return L
QR,KR,MR,W,PM=120,128,4,24,6
def unit(q0,q1):
    rows=q1-q0; sc=pv=0; sc_full=0; blocks=0; partial=0; nonband=0; smx=0
    for k0 in range(0,q1,KR):
        nk=min(KR,q1-k0); blocks+=1
        full = k0+nk<=q0+1
        smx+=rows*nk
        if full: sc+=nk*rows; pv+=nk*rows; continue
        partial+=1
        if nk%MR==0 and rows%W==0:
            for n0 in range(0,rows,W):
                hi=min(q0+n0+W,k0+nk)-k0; hi=(hi+MR-1)//MR*MR
                if hi>0: sc+=hi*W
            for m0 in range(0,rows,PM):
                mr=min(PM,rows-m0); hi=min(q0+m0+mr,k0+nk)-k0
                if hi>0: pv+=hi*mr
        else:
            nonband+=1
            sc+=nk*(math.ceil(rows/8)*8); pv+=nk*rows
    return sc,pv,blocks,partial,nonband,smx
def seq(S):
    cr=S*(S+1)//2; sc=pv=bl=pa=nb=sm=0; units=0
    for q0 in range(0,S,QR):
        a=unit(q0,min(S,q0+QR)); sc+=a[0];pv+=a[1];bl+=a[2];pa+=a[3];nb+=a[4];sm+=a[5]; units+=1
    return cr,sc,pv,bl,pa,nb,sm,units
def report(name,Ls):
    T=[0]*8
    for S in Ls:
        r=seq(S); T=[a+b for a,b in zip(T,r)]
    cr,sc,pv,bl,pa,nb,sm,u=T
    print(f"{name}: credited pairs {cr}, score executed {sc/cr:.4f}x, PV executed {pv/cr:.4f}x, softmax elements {sm/cr:.4f}x; units {u}, key blocks {bl}, partly masked {pa} (not band-trimmed {nb})")
if __name__ == "__main__":
    report("causal S=2048 (per head)",[2048])
    L=lengths(32768); print(len(L), "sequences, sum", sum(L), "min",min(L),"max",max(L)); print(sorted(L))
    report("TND 32K",L)
