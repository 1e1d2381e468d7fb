// Cost of clock_gettime(CLOCK_MONOTONIC) and of rdtsc-free spinning on this host.
#include <stdio.h>
#include <time.h>
#include <stdint.h>
static uint64_t ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return (uint64_t)t.tv_sec*1000000000ull+t.tv_nsec;}
int main(void){
  const int N=2000000; uint64_t a=ns(),x=0;
  for(int i=0;i<N;i++) x+=ns();
  uint64_t b=ns();
  printf("clock_gettime: %.1f ns per call (%llu)\n",(double)(b-a)/N,(unsigned long long)(x&1));
  return 0;
}
