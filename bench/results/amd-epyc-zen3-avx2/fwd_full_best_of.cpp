// Whole FlashAttentionScore forward through the C++ API, 1 thread (attnopsSetDeviceThreads(0, 1)), B=1 N=1 D=128
// fp32 BNSD: best of many calls (wall clock) against a 12-chain FMA loop timed the same way, for shared machines.
// usage: <binary> S trials causal(0|1). Build: g++ -O2 -std=c++20 -Iinclude -Ibuild/include THIS build/libattnops.a -lpthread
#include "attnops/attnops.hpp"
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "measure.hpp"

static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
int main(int argc,char**argv){
  const int64_t S=argc>1?atoi(argv[1]):512, N=1, D=128; int trials=argc>2?atoi(argv[2]):200; int causal=argc>3?atoi(argv[3]):0;
  std::vector<float> q(N*S*D),k(N*S*D),v(N*S*D),o(N*S*D),mx(N*S*8),sm(N*S*8);
  std::mt19937 g(1); std::uniform_real_distribution<float> u(-1,1);
  for(auto*x:{&q,&k,&v}) for(auto&y:*x) y=u(g);
  attnopsSetDeviceThreads(0,1);
  using namespace attnops;
  Tensor tq(q.data(),ATTNOPS_FLOAT32,{1,N,S,D}),tk(k.data(),ATTNOPS_FLOAT32,{1,N,S,D}),tv(v.data(),ATTNOPS_FLOAT32,{1,N,S,D}),
    to(o.data(),ATTNOPS_FLOAT32,{1,N,S,D}),tm(mx.data(),ATTNOPS_FLOAT32,{1,N,S,8}),ts(sm.data(),ATTNOPS_FLOAT32,{1,N,S,8});
  std::vector<uint8_t> mask(2048*2048); for(int i=0;i<2048;++i)for(int j=0;j<2048;++j)mask[i*2048+j]=j>i;
  Tensor tmask(mask.data(),ATTNOPS_BOOL,{2048,2048});
  FlashAttentionScoreArgs a; a.query=&tq;a.key=&tk;a.value=&tv;a.attentionOut=&to;a.softmaxMax=&tm;a.softmaxSum=&ts;a.headNum=N;a.scaleValue=0.0884;
  if(causal){a.sparseMode=3;a.attenMask=&tmask;}
  Workspace ws;
  flashAttentionScore(a,nullptr,&ws);
  double bp=1e9,bf=1e9;
  for(int t=0;t<trials;++t){double t0=now();peak(100000);double t1=now();bp=std::min(bp,t1-t0);
    t0=now();flashAttentionScore(a,nullptr,&ws);t1=now();bf=std::min(bf,t1-t0);}
  double pk=100000.0*12*16/bp/1e9; double fl=4.0*S*S*D*N*(causal?0.5*(S+1)/S:1.0);
  printf("S=%ld causal=%d best of %d: peak %.1f GF/s, forward %.3f ms %.1f GF/s = %.1f%%\n",(long)S,causal,trials,pk,bf*1e3,fl/bf/1e9,100*fl/bf/1e9/pk);
}
