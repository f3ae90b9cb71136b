// Whole FlashAttentionScore forward through the C++ API, B=1 BNSD D=128 (N query heads on N2 kv heads), best-of wall
// time; T=threads from the environment (default 1). usage: <binary> S N N2 bf16(0|1) trials causal(0|1)
// Build: g++ -O2 -std=c++20 -Iinclude -Ibuild/include THIS build/libattnops.a -lpthread (from the repository root).
#include "attnops/attnops.hpp"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <cstring>
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
int main(int argc,char**argv){
  const int64_t S=atoi(argv[1]),N=atoi(argv[2]),N2=atoi(argv[3]),D=128; int bf=atoi(argv[4]); int trials=atoi(argv[5]); int causal=atoi(argv[6]);
  size_t es=bf?2:4;
  std::vector<char> q(N*S*D*es),k(N2*S*D*es),v(N2*S*D*es),o(N*S*D*es); std::vector<float> mx(N*S*8),sm(N*S*8);
  std::mt19937 g(1); std::uniform_real_distribution<float> u(-1,1);
  for(auto*x:{&q,&k,&v}){ size_t n=x->size()/es; for(size_t i=0;i<n;++i){float f=u(g); if(bf){uint32_t b;memcpy(&b,&f,4);uint16_t h=b>>16;memcpy(x->data()+2*i,&h,2);} else memcpy(x->data()+4*i,&f,4);} }
  attnopsSetDeviceThreads(0,getenv("T")?atoi(getenv("T")):1);
  using namespace attnops;
  auto dt=bf?ATTNOPS_BFLOAT16:ATTNOPS_FLOAT32;
  Tensor tq(q.data(),dt,{1,N,S,D}),tk(k.data(),dt,{1,N2,S,D}),tv(v.data(),dt,{1,N2,S,D}),
    to(o.data(),dt,{1,N,S,D}),tm(mx.data(),ATTNOPS_FLOAT32,{1,N,S,8}),ts(sm.data(),ATTNOPS_FLOAT32,{1,N,S,8});
  std::vector<uint8_t> mask(2048*2048); for(int i=0;i<2048;++i)for(int j=0;j<2048;++j)mask[i*2048+j]=j>i;
  Tensor tmask(mask.data(),ATTNOPS_BOOL,{2048,2048});
  FlashAttentionScoreArgs a; a.query=&tq;a.key=&tk;a.value=&tv;a.attentionOut=&to;a.softmaxMax=&tm;a.softmaxSum=&ts;a.headNum=N;a.scaleValue=0.0884;
  if(causal){a.sparseMode=3;a.attenMask=&tmask;}
  Workspace ws;
  flashAttentionScore(a,nullptr,&ws);
  double bfw=1e9;
  for(int t=0;t<trials;++t){double t0=now();flashAttentionScore(a,nullptr,&ws);double t1=now();bfw=std::min(bfw,t1-t0);}
  double fl=4.0*S*S*D*N*(causal?0.5*(S+1)/S:1.0);
  printf("S=%ld N=%ld/%ld %s causal=%d best of %d: forward %.3f ms %.1f GF/s\n",(long)S,(long)N,(long)N2,bf?"bf16":"fp32",causal,trials,bfw*1e3,fl/bfw/1e9);
}
