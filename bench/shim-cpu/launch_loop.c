/* Host time per asynchronous launch, 256 per batch, as bench/cuda/launch_overhead.cu measures on the
 * GPU (or, with a second argument N, the latency of N requests of 10 launches and a stream
 * synchronize; or, with `backlog BATCHES STREAM HOST_NS`, how fast a backlogged stream's window is
 * fed: batches of 256 launches, each then synchronized, on the legacy stream (STREAM 0) or a
 * created one (1), with HOST_NS of spinning before each launch, a stand-in for a framework's own
 * time per operation; the stand-in libcuda makes a batch 512 µs of device work); prints one JSON
 * object. Reaches the driver as the CUDA runtime does (cuGetProcAddress). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef int CUresult; typedef void *CUstream; typedef void *CUcontext; typedef void *CUfunction; typedef void *CUmodule;
typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);
static double now_us(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static void spin(long ns){ double t=now_us(); while((now_us()-t)*1000 < ns){} }
int main(int argc,char**argv){
  int launches = argc>1?atoi(argv[1]):20000;
  void*h=dlopen("libcuda.so.1",RTLD_NOW); getproc_t gp=(getproc_t)dlsym(h,"cuGetProcAddress_v2");
  #define G(v,n) void* v; {int st; if(gp(n,&v,12000,0,&st)||!v){fprintf(stderr,"no %s\n",n);return 2;}}
  G(init,"cuInit") G(retain,"cuDevicePrimaryCtxRetain") G(setcur,"cuCtxSetCurrent") G(mload,"cuModuleLoadData")
  G(getf,"cuModuleGetFunction") G(screate,"cuStreamCreate") G(launch,"cuLaunchKernel") G(ssync,"cuStreamSynchronize")
  ((CUresult(*)(unsigned))init)(0); CUcontext c; ((CUresult(*)(CUcontext*,int))retain)(&c,0); ((CUresult(*)(CUcontext))setcur)(c);
  CUmodule m; ((CUresult(*)(CUmodule*,const void*))mload)(&m,"image"); CUfunction f; ((CUresult(*)(CUfunction*,CUmodule,const char*))getf)(&f,m,"kernel");
  CUresult (*L)(CUfunction,unsigned,unsigned,unsigned,unsigned,unsigned,unsigned,unsigned,CUstream,void**,void**)=launch;
  CUresult (*S)(CUstream)=ssync;
  if(argc>1 && !strcmp(argv[1],"backlog")){
    int nb=argc>2?atoi(argv[2]):200; long host_ns=argc>4?atol(argv[4]):0;
    CUstream q=0; if(argc>3 && atoi(argv[3])) ((CUresult(*)(CUstream*,unsigned))screate)(&q,0);
    double *per = malloc(nb*sizeof(double));
    for(int b=0;b<nb;b++){ double t=now_us(); for(int i=0;i<256;i++){ long a=i,us=0; unsigned long fl=0; unsigned long long p=0; void*pa[4]={&a,&us,&fl,&p}; spin(host_ns); if(L(f,1,1,1,32,1,1,0,q,pa,NULL)) {fprintf(stderr,"launch failed\n");return 1;} } S(q); per[b]=now_us()-t;}
    qsort(per,nb,sizeof(double),cmp);
    printf("{\"batch_us_p50\": %.0f, \"batch_us_p90\": %.0f, \"device_us\": 512}\n", per[nb/2], per[nb*9/10]);
    return 0; }
  CUstream s; ((CUresult(*)(CUstream*,unsigned))screate)(&s,1);
  if(argc>2){ /* requests: 10 launches + a stream synchronize, 1 ms apart (an LC request) */
    int nr=atoi(argv[2]); double *lat=malloc(nr*sizeof(double)); struct timespec gap={0,1000000};
    for(int r=0;r<nr;r++){ nanosleep(&gap,NULL); double t=now_us();
      for(int i=0;i<10;i++){ long a=i,us=0; unsigned long fl=0; unsigned long long p=0; void*pa[4]={&a,&us,&fl,&p}; if(L(f,1,1,1,32,1,1,0,s,pa,NULL)) {fprintf(stderr,"launch failed\n");return 1;} }
      S(s); lat[r]=now_us()-t; }
    qsort(lat,nr,sizeof(double),cmp);
    printf("{\"request_us_p50\": %.2f, \"request_us_p90\": %.2f, \"request_us_p99\": %.2f}\n", lat[nr/2], lat[nr*9/10], lat[nr*99/100]);
    return 0; }
  int nb = launches/256; double *per = malloc(nb*sizeof(double));
  for(int b=0;b<nb;b++){ double t=now_us(); for(int i=0;i<256;i++){ long a=i,us=0; unsigned long fl=0; unsigned long long p=0; void*pa[4]={&a,&us,&fl,&p}; if(L(f,1,1,1,32,1,1,0,s,pa,NULL)) {fprintf(stderr,"launch failed\n");return 1;} } per[b]=(now_us()-t)/256; S(s);}
  qsort(per,nb,sizeof(double),cmp); double mean=0; for(int b=0;b<nb;b++) mean+=per[b]; mean/=nb;
  printf("{\"launch_us_p50\": %.3f, \"launch_us_mean\": %.3f}\n", per[nb/2], mean);
  return 0; }
