/* How fast a backlogged stream's window is fed (bench/shim-cpu/backlog.sh): batches of 256 launches,
 * each batch then synchronized, against the stand-in libcuda (2 µs kernels, so a batch is 512 µs
 * of device work); prints the batch's wall time. Reaches the driver as the CUDA runtime does. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int CUresult; typedef void *CUstream; typedef void *CUcontext; typedef void *CUfunction; typedef void *CUmodule;
typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);
static double now_us(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e6+t.tv_nsec/1e3;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
/* argv[1]: batches; argv[2]: 0 the legacy stream, 1 a created stream; argv[3]: host work before
 * each launch (ns of spinning, a stand-in for a framework's own time per operation). */
static void spin(long ns){ double t=now_us(); while((now_us()-t)*1000 < ns){} }
int main(int argc,char**argv){
  int nb = argc>1?atoi(argv[1]):200; int created = argc>2?atoi(argv[2]):0; long host_ns = argc>3?atol(argv[3]):0;
  void*h=dlopen("libcuda.so.1",RTLD_NOW); getproc_t gp=(getproc_t)dlsym(h,"cuGetProcAddress_v2");
  #define G(v,n) void* v; {int st; if(gp(n,&v,12000,0,&st)||!v){fprintf(stderr,"no %s\n",n);return 2;}}
  G(init,"cuInit") G(retain,"cuDevicePrimaryCtxRetain") G(setcur,"cuCtxSetCurrent") G(mload,"cuModuleLoadData")
  G(getf,"cuModuleGetFunction") G(screate,"cuStreamCreate") G(launch,"cuLaunchKernel") G(ssync,"cuStreamSynchronize")
  ((CUresult(*)(unsigned))init)(0); CUcontext c; ((CUresult(*)(CUcontext*,int))retain)(&c,0); ((CUresult(*)(CUcontext))setcur)(c);
  CUmodule m; ((CUresult(*)(CUmodule*,const void*))mload)(&m,"image"); CUfunction f; ((CUresult(*)(CUfunction*,CUmodule,const char*))getf)(&f,m,"kernel");
  CUstream s = 0; if (created) ((CUresult(*)(CUstream*,unsigned))screate)(&s,0);
  CUresult (*L)(CUfunction,unsigned,unsigned,unsigned,unsigned,unsigned,unsigned,unsigned,CUstream,void**,void**)=launch;
  CUresult (*S)(CUstream)=ssync;
  double *per = malloc(nb*sizeof(double));
  for(int b=0;b<nb;b++){ double t=now_us(); for(int i=0;i<256;i++){ long a=i,us=0; unsigned long fl=0; unsigned long long p=0; void*pa[4]={&a,&us,&fl,&p}; spin(host_ns); if(L(f,1,1,1,32,1,1,0,s,pa,NULL)) {fprintf(stderr,"launch failed\n");return 1;} } S(s); per[b]=now_us()-t;}
  qsort(per,nb,sizeof(double),cmp);
  printf("{\"batch_us_p50\": %.0f, \"batch_us_p90\": %.0f, \"device_us\": 512}\n", per[nb/2], per[nb*9/10]);
  return 0; }
