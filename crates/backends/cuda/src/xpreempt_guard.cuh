// xpreempt_guard.cuh: block-level preemption with exact resume for CUDA kernels (xpreempt Lv2).
//
// A guarded kernel takes XP_GUARD_PARAMS as its first three parameters; xpreempt fills them in
// (the queue's preempt flag in device memory, the launch's completion array and its epoch).
//
//   extern "C" __global__ void k(XP_GUARD_PARAMS, float* x) {
//       if (!xp_block_begin(XP_GUARD_ARGS)) return;   // preempted, or finished in an earlier run
//       ... the block's work ...
//       xp_block_end(XP_GUARD_ARGS);                  // marks this block finished
//   }
//
// A block that starts while the flag is set exits at once and records nothing; a block marked
// finished is skipped when xpreempt relaunches the kernel after a resume: every block runs exactly
// once. Blocks must not return between begin and end except all together.
//
// Persistent kernels (one wave looping over work items) guard each item instead:
//
//   for (unsigned i = blockIdx.x; i < n; i += gridDim.x) {
//       int s = xp_item_begin(XP_GUARD_ARGS, i);   // 0 run, 1 skip (done), -1 stop now
//       if (s < 0) return; if (s > 0) continue;
//       ... item i ...
//       xp_item_end(XP_GUARD_ARGS, i);
//   }
//
// The completion array holds one u32 per block (or item): it is finished when the word equals the
// launch's epoch, so xpreempt never has to clear it between launches.
//
// Unmodified applications (xpreempt run, the LD_PRELOAD shim): mark each guarded kernel with
// XP_GUARD_MARK and launch it with placeholders for the guard's three parameters: a null flag, a
// null completion array and epoch 0 (cudaLaunchKernel, <<<>>>, cuLaunchKernel, cuLaunchKernelEx):
//
//   XP_GUARD_MARK(scale)
//   extern "C" __global__ void scale(XP_GUARD_PARAMS, float* x, float a) { ... as above ... }
//   scale<<<grid, block, 0, stream>>>(XP_GUARD_NONE, x, a);
//
// A null flag never stops a block and a null completion array records nothing, so the kernel runs
// as a plain kernel without the shim, or at Lv1/Lv3. Under the shim at Lv2 the shim recognizes the
// kernel by its marker (a device global named xpreempt_guard_<kernel name>, found through the
// launched function's module or library) and by its first three parameters having the guard's
// layout, and fills them in per launch. The marker names the kernel as the driver does
// (cuFuncGetName): give guarded kernels C linkage. Only per-block guarding is recognized by the
// shim (persistent kernels with xp_item_* are launched as plain kernels there).
#pragma once

#define XP_GUARD_PARAMS const volatile int* xp_flag, unsigned* xp_done, unsigned xp_epoch
#define XP_GUARD_ARGS xp_flag, xp_done, xp_epoch
// The placeholders an application passes for XP_GUARD_PARAMS (the shim fills in the real ones).
#define XP_GUARD_NONE ((const volatile int*)0), ((unsigned*)0), 0u
// The marker by which the shim recognizes kernel `name` as guard-built (its value: 1, one
// completion word per block).
#define XP_GUARD_MARK(name) extern "C" { __device__ unsigned xpreempt_guard_##name = 1u; }

__device__ __forceinline__ unsigned xp_block_id() {
    return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

__device__ __forceinline__ bool xp_thread0() {
    return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
}

#ifdef XP_NO_GUARD
__device__ __forceinline__ bool xp_block_begin(XP_GUARD_PARAMS) { return true; }
__device__ __forceinline__ void xp_block_end(XP_GUARD_PARAMS) {}
__device__ __forceinline__ int xp_item_begin(XP_GUARD_PARAMS, unsigned) { return 0; }
__device__ __forceinline__ void xp_item_end(XP_GUARD_PARAMS, unsigned) {}
#else
__device__ __forceinline__ bool xp_block_begin(XP_GUARD_PARAMS) {
    __shared__ int xp_run;
    if (xp_thread0()) {
        // Both loads in flight at once: a skipped block costs one memory round trip. A null
        // flag never stops; a null completion array never says finished (placeholders).
        int flag = xp_flag ? *xp_flag : 0;
        unsigned done = xp_done ? ((volatile unsigned*)xp_done)[xp_block_id()] : ~xp_epoch;
        xp_run = (flag == 0) & (done != xp_epoch);
    }
    __syncthreads();
    return xp_run != 0;
}

__device__ __forceinline__ void xp_block_end(XP_GUARD_PARAMS) {
    __syncthreads();
    // No fence needed: the mark is only read by a relaunch, which stream order puts after this
    // kernel's exit.
    if (xp_thread0() && xp_done) {
        ((volatile unsigned*)xp_done)[xp_block_id()] = xp_epoch;
    }
}

__device__ __forceinline__ int xp_item_begin(XP_GUARD_PARAMS, unsigned item) {
    __shared__ int xp_stop;
    // Both loads in flight at once. Within one launch only this block writes this item's word,
    // so every thread reads the same value and a finished item is skipped without a barrier.
    unsigned done = xp_done ? ((volatile unsigned*)xp_done)[item] : ~xp_epoch;
    int flag = (xp_thread0() && xp_flag) ? *xp_flag : 0;
    if (done == xp_epoch) return 1;
    __syncthreads();  // all threads are done with the previous item's xp_stop
    if (xp_thread0()) xp_stop = (flag != 0);
    __syncthreads();
    return xp_stop ? -1 : 0;
}

__device__ __forceinline__ void xp_item_end(XP_GUARD_PARAMS, unsigned item) {
    __syncthreads();
    if (xp_thread0() && xp_done) {
        ((volatile unsigned*)xp_done)[item] = xp_epoch;
    }
}
#endif
