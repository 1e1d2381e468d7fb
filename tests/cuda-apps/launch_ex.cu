// The launch paths beside <<<>>>: cooperative launch with grid-wide sync (runtime and driver),
// cudaLaunchKernelEx / cuLaunchKernelEx with attributes (thread-block clusters with distributed
// shared memory, per-launch priority, cooperative, programmatic dependent launch), each queued
// behind long work on the same stream.
#include "common.h"

#include <cooperative_groups.h>
#include <cuda.h>

namespace cg = cooperative_groups;

static const int N = 1 << 20;

// Grid-wide two-phase sum: every block writes its partial sum, grid.sync(), then every block
// reads all partials; out[b] = total for each block b (all equal if the sync held).
__global__ void coop_sum(const int *in, int n, long long *partials, long long *out) {
  cg::grid_group grid = cg::this_grid();
  __shared__ long long acc;
  if (threadIdx.x == 0) acc = 0;
  __syncthreads();
  long long mine = 0;
  for (int i = grid.thread_rank(); i < n; i += grid.size()) mine += in[i];
  atomicAdd((unsigned long long *)&acc, (unsigned long long)mine);
  __syncthreads();
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
  grid.sync();
  if (threadIdx.x == 0) {
    long long total = 0;
    for (unsigned b = 0; b < gridDim.x; b++) total += partials[b];
    out[blockIdx.x] = total;
  }
}

// Cluster of 2 blocks: each block fills its shared array, the cluster syncs, and each block
// reads its partner's shared memory: out[i] = partner's value for i.
__global__ void cluster_swap(int *out, int n_per_block) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ int smem[256];
  unsigned rank = cluster.block_rank();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) smem[i] = (int)(blockIdx.x * 1000 + i);
  cluster.sync();
  int *partner = cluster.map_shared_rank(smem, rank ^ 1);
  for (int i = threadIdx.x; i < n_per_block && i < 256; i += blockDim.x)
    out[blockIdx.x * n_per_block + i] = partner[i];
  cluster.sync();  // the partner's shared memory must outlive our reads
#endif
}

// Programmatic dependent launch: the primary writes buf, then signals; the secondary may start
// early but must call cudaGridDependencySynchronize() before reading buf.
__global__ void pdl_primary(int *buf, int n, unsigned long long spin_ns) {
  uint64_t t0 = gtimer_ns();
  while (gtimer_ns() - t0 < spin_ns) {
  }
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) buf[i] = 3 * i + 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

__global__ void pdl_secondary(const int *buf, int *out, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = buf[i] + 1;
}

static void check_coop(const long long *out_d, int blocks, long long want, const char *name) {
  std::vector<long long> o(blocks);
  CK(cudaMemcpy(o.data(), out_d, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
  bool ok = true;
  for (int b = 0; b < blocks; b++) ok = ok && o[b] == want;
  check(ok, name, "block 0 saw %lld, expected %lld", o[0], want);
  g_digest.add_u64((uint64_t)o[0]);
}

int main() {
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  check(prop.cooperativeLaunch == 1, "device_supports_cooperative_launch");
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  int *in;
  CK(cudaMalloc(&in, N * sizeof(int)));
  iota<<<blocks_for(N), 256, 0, s>>>(in, N, 1, 0);
  long long want = (long long)N * (N - 1) / 2;

  // 1. cudaLaunchCooperativeKernel behind long work.
  const int threads = 256;
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, coop_sum, threads, 0));
  int blocks = per_sm * prop.multiProcessorCount;
  long long *partials, *out;
  CK(cudaMalloc(&partials, blocks * sizeof(long long)));
  CK(cudaMalloc(&out, blocks * sizeof(long long)));
  spin(s, 100.0);
  int n = N;
  void *args[] = {&in, &n, &partials, &out};
  CK(cudaLaunchCooperativeKernel((void *)coop_sum, blocks, threads, args, 0, s));
  CK(cudaStreamSynchronize(s));
  check_coop(out, blocks, want, "runtime_cooperative_launch");

  // 2. cuLaunchCooperativeKernel (driver) on the function of the same kernel.
  cudaFunction_t fn;
  CK(cudaGetFuncBySymbol(&fn, (const void *)coop_sum));
  CK(cudaMemset(out, 0, blocks * sizeof(long long)));
  spin(s, 50.0);
  CUresult r = cuLaunchCooperativeKernel((CUfunction)fn, blocks, 1, 1, threads, 1, 1, 0, (CUstream)s, args);
  check(r == CUDA_SUCCESS, "driver_cooperative_launch_accepted");
  CK(cudaStreamSynchronize(s));
  check_coop(out, blocks, want, "driver_cooperative_launch");

  // 3. cudaLaunchKernelEx with the cooperative and priority attributes.
  {
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaLaunchAttribute attrs[2];
    attrs[0].id = cudaLaunchAttributeCooperative;
    attrs[0].val.cooperative = 1;
    attrs[1].id = cudaLaunchAttributePriority;
    attrs[1].val.priority = hi;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = s;
    cfg.attrs = attrs;
    cfg.numAttrs = 2;
    CK(cudaMemset(out, 0, blocks * sizeof(long long)));
    spin(s, 50.0);
    CK(cudaLaunchKernelEx(&cfg, coop_sum, (const int *)in, n, partials, out));
    CK(cudaStreamSynchronize(s));
    check_coop(out, blocks, want, "launch_ex_cooperative_priority");
  }

  // 4. Clusters: cudaLaunchKernelEx and cuLaunchKernelEx with a cluster dimension of 2.
  if (prop.major >= 9) {
    const int cl_blocks = 64, per_block = 256;
    int *cl_out;
    CK(cudaMalloc(&cl_out, cl_blocks * per_block * sizeof(int)));
    for (int variant = 0; variant < 2; variant++) {
      CK(cudaMemset(cl_out, 0, cl_blocks * per_block * sizeof(int)));
      spin(s, 50.0);
      if (variant == 0) {
        cudaLaunchAttribute a[1];
        a[0].id = cudaLaunchAttributeClusterDimension;
        a[0].val.clusterDim.x = 2;
        a[0].val.clusterDim.y = 1;
        a[0].val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(cl_blocks);
        cfg.blockDim = dim3(128);
        cfg.stream = s;
        cfg.attrs = a;
        cfg.numAttrs = 1;
        CK(cudaLaunchKernelEx(&cfg, cluster_swap, cl_out, per_block));
      } else {
        cudaFunction_t cf;
        CK(cudaGetFuncBySymbol(&cf, (const void *)cluster_swap));
        CUlaunchAttribute a[1];
        a[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        a[0].value.clusterDim.x = 2;
        a[0].value.clusterDim.y = 1;
        a[0].value.clusterDim.z = 1;
        CUlaunchConfig cfg = {};
        cfg.gridDimX = cl_blocks;
        cfg.gridDimY = cfg.gridDimZ = 1;
        cfg.blockDimX = 128;
        cfg.blockDimY = cfg.blockDimZ = 1;
        cfg.hStream = (CUstream)s;
        cfg.attrs = a;
        cfg.numAttrs = 1;
        int pb = per_block;
        void *cargs[] = {&cl_out, &pb};
        CUresult cr = cuLaunchKernelEx(&cfg, (CUfunction)cf, cargs, nullptr);
        check(cr == CUDA_SUCCESS, "driver_launch_ex_cluster_accepted");
      }
      CK(cudaStreamSynchronize(s));
      std::vector<int> v(cl_blocks * per_block);
      CK(cudaMemcpy(v.data(), cl_out, v.size() * sizeof(int), cudaMemcpyDeviceToHost));
      bool ok = true;
      for (int b = 0; b < cl_blocks && ok; b++)
        for (int i = 0; i < per_block && ok; i++) ok = v[b * per_block + i] == (b ^ 1) * 1000 + i;
      check(ok, variant ? "driver_launch_ex_cluster_dsmem" : "runtime_launch_ex_cluster_dsmem");
      g_digest.add_vec(v);
    }
  } else {
    note("compute capability %d.%d: no clusters", prop.major, prop.minor);
  }

  // 5. Programmatic dependent launch, repeated, behind long work.
  {
    int *buf, *res;
    const int m = 1 << 16;
    CK(cudaMalloc(&buf, m * sizeof(int)));
    CK(cudaMalloc(&res, m * sizeof(int)));
    bool ok = true;
    for (int it = 0; it < 20; it++) {
      CK(cudaMemsetAsync(buf, 0, m * sizeof(int), s));
      if (it == 0) spin(s, 50.0);
      pdl_primary<<<blocks_for(m), 256, 0, s>>>(buf, m, it % 4 == 0 ? 2000000ull : 0ull);
      cudaLaunchAttribute a[1];
      a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a[0].val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(blocks_for(m));
      cfg.blockDim = dim3(256);
      cfg.stream = s;
      cfg.attrs = a;
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, pdl_secondary, (const int *)buf, res, m));
      std::vector<int> v(m);
      CK(cudaMemcpyAsync(v.data(), res, m * sizeof(int), cudaMemcpyDeviceToHost, s));
      CK(cudaStreamSynchronize(s));
      for (int i = 0; i < m && ok; i++) ok = v[i] == 3 * i + 2;
      if (it == 19) g_digest.add_vec(v);
    }
    check(ok, "programmatic_dependent_launch");
  }
  CK(cudaStreamDestroy(s));
  return finish();
}
