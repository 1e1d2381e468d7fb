/* A stand-in libcuda for timing the shim's own cost per launch (bench/shim-cpu/run.sh): launches take
 * a global lock (as the real driver does) and append to a per-stream virtual timeline; kernels
 * "run" for KERNEL_NS each; events complete when the wall clock passes their recorded time. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef int CUresult;
#define KERNEL_NS 2000
static pthread_mutex_t lk = PTHREAD_MUTEX_INITIALIZER;
static __thread void *cur;
static long now_ns(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1000000000L+t.tv_nsec;}
struct stream { long tail; unsigned flags; };
struct event { long at; };
static struct stream legacy;
static int ctx_obj;
static struct stream *S(void *h){ return (h==0||h==(void*)1)?&legacy:(struct stream*)h; }
CUresult cuInit(unsigned f){(void)f;return 0;}
CUresult cuDriverGetVersion(int *v){*v=13000;return 0;}
CUresult cuDeviceGet(int *d,int o){(void)o;*d=0;return 0;}
CUresult cuDeviceGetCount(int *n){*n=1;return 0;}
CUresult cuDevicePrimaryCtxRetain(void **c,int d){(void)d;*c=&ctx_obj;return 0;}
CUresult cuCtxSetCurrent(void *c){cur=c;return 0;}
CUresult cuCtxGetCurrent(void **c){*c=cur;return 0;}
CUresult cuCtxPushCurrent_v2(void *c){cur=c;return 0;}
CUresult cuCtxPopCurrent_v2(void **c){*c=cur;return 0;}
CUresult cuCtxGetDevice(int *d){*d=0;return 0;}
CUresult cuCtxGetStreamPriorityRange(int *l,int *g){*l=0;*g=-5;return 0;}
CUresult cuModuleLoadData(void **m,const void *i){(void)i;*m=malloc(8);return 0;}
CUresult cuModuleGetFunction(void **f,void *m,const char *n){(void)m;(void)n;*f=malloc(8);return 0;}
CUresult cuFuncGetParamInfo(void *f,size_t i,size_t *o,size_t *s){(void)f;if(i>=4)return 1;*o=i*8;*s=8;return 0;}
CUresult cuKernelGetParamInfo(void *f,size_t i,size_t *o,size_t *s){return cuFuncGetParamInfo(f,i,o,s);}
CUresult cuStreamCreate(void **s,unsigned fl){struct stream *x=calloc(1,sizeof *x);x->flags=fl;*s=x;return 0;}
CUresult cuStreamCreateWithPriority(void **s,unsigned fl,int p){(void)p;return cuStreamCreate(s,fl);}
CUresult cuStreamDestroy_v2(void *s){(void)s;return 0;}
CUresult cuStreamGetCtx(void *s,void **c){(void)s;*c=&ctx_obj;return 0;}
CUresult cuStreamGetFlags(void *s,unsigned *f){*f=S(s)->flags;return 0;}
CUresult cuStreamIsCapturing(void *s,unsigned *st){(void)s;*st=0;return 0;}
CUresult cuThreadExchangeStreamCaptureMode(unsigned *m){(void)m;return 0;}
static void push(void *h){ pthread_mutex_lock(&lk); struct stream *s=S(h); long n=now_ns(); s->tail=(s->tail>n?s->tail:n)+KERNEL_NS; pthread_mutex_unlock(&lk);}
CUresult cuLaunchKernel(void *f,unsigned a,unsigned b,unsigned c,unsigned d,unsigned e,unsigned g,unsigned sm,void *s,void **p,void **x){(void)f;(void)a;(void)b;(void)c;(void)d;(void)e;(void)g;(void)sm;(void)p;(void)x;push(s);return 0;}
CUresult cuEventCreate(void **e,unsigned f){(void)f;*e=calloc(1,sizeof(struct event));return 0;}
CUresult cuEventDestroy_v2(void *e){free(e);return 0;}
CUresult cuEventRecord(void *e,void *h){pthread_mutex_lock(&lk);((struct event*)e)->at=S(h)->tail;pthread_mutex_unlock(&lk);return 0;}
CUresult cuEventQuery(void *e){pthread_mutex_lock(&lk);long at=((struct event*)e)->at;pthread_mutex_unlock(&lk);return now_ns()>=at?0:600;}
CUresult cuEventSynchronize(void *e){while(cuEventQuery(e));return 0;}
CUresult cuStreamSynchronize(void *h){pthread_mutex_lock(&lk);long t=S(h)->tail;pthread_mutex_unlock(&lk);while(now_ns()<t);return 0;}
CUresult cuStreamQuery(void *h){pthread_mutex_lock(&lk);long t=S(h)->tail;pthread_mutex_unlock(&lk);return now_ns()>=t?0:600;}
CUresult cuCtxSynchronize(void){return cuStreamSynchronize(0);}
struct sym { const char *n; void *p; };
#define E(x) {#x,(void*)x}
static struct sym syms[]={E(cuInit),E(cuDriverGetVersion),E(cuDeviceGet),E(cuDeviceGetCount),E(cuDevicePrimaryCtxRetain),E(cuCtxSetCurrent),E(cuCtxGetCurrent),E(cuCtxGetDevice),E(cuModuleLoadData),E(cuModuleGetFunction),E(cuStreamCreate),E(cuStreamGetCtx),E(cuStreamGetFlags),E(cuLaunchKernel),E(cuEventCreate),E(cuEventRecord),E(cuEventQuery),E(cuEventSynchronize),E(cuStreamSynchronize),E(cuStreamQuery),E(cuCtxSynchronize),{0,0}};
CUresult cuGetProcAddress_v2(const char *n,void **p,int v,unsigned long long f,int *st){(void)v;(void)f;for(struct sym *s=syms;s->n;s++)if(!strcmp(s->n,n)){*p=s->p;if(st)*st=1;return 0;}*p=0;if(st)*st=0;return 500;}
