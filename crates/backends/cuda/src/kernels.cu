// Benchmark and test kernels of xpreempt's CUDA backend, compiled at run time with NVRTC
// (twice: guarded, and with XP_NO_GUARD for the native and Lv1 baselines).

// Busy work that only advances while the block runs (a time spin would count time spent
// switched out as progress).
__device__ __forceinline__ float xp_burn(unsigned iters, float x) {
    for (unsigned i = 0; i < iters; ++i) {
        x = x * 0.999999f + 0.000001f;
    }
    return x;
}

// Each block burns `iters`; counts[block] += 1 when counts is set; *total += 1 per block.
extern "C" __global__ void xp_spin(XP_GUARD_PARAMS, unsigned iters, unsigned* counts,
                                   unsigned long long* total, float* sink) {
    if (!xp_block_begin(XP_GUARD_ARGS)) return;
    float x = xp_burn(iters, (float)threadIdx.x);
    if (x == 12345.0f) sink[0] = x;  // keeps the loop alive
    __syncthreads();
    if (xp_thread0()) {
        if (counts) atomicAdd(&counts[xp_block_id()], 1u);
        if (total) atomicAdd(total, 1ull);
    }
    xp_block_end(XP_GUARD_ARGS);
}

// A persistent kernel: one wave loops over `items` work items of `iters` each.
extern "C" __global__ void xp_persistent(XP_GUARD_PARAMS, unsigned items, unsigned iters,
                                         unsigned* counts, unsigned long long* total, float* sink) {
    for (unsigned i = blockIdx.x; i < items; i += gridDim.x) {
        int s = xp_item_begin(XP_GUARD_ARGS, i);
        if (s < 0) return;
        if (s > 0) continue;
        float x = xp_burn(iters, (float)threadIdx.x + i);
        if (x == 12345.0f) sink[0] = x;
        __syncthreads();
        if (xp_thread0()) {
            if (counts) atomicAdd(&counts[i], 1u);
            if (total) atomicAdd(total, 1ull);
        }
        xp_item_end(XP_GUARD_ARGS, i);
    }
}

// Progress probe for the Lv3 test: block 0 thread 0 bumps a device counter `iters` times.
extern "C" __global__ void xp_progress(unsigned long long rounds, unsigned iters,
                                       volatile unsigned long long* progress, float* sink) {
    float x = threadIdx.x;
    for (unsigned long long r = 0; r < rounds; ++r) {
        x = xp_burn(iters, x);
        if (threadIdx.x == 0 && blockIdx.x == 0) *progress = r + 1;
    }
    if (x == 12345.0f) sink[0] = x;
}

// Order probe: out[idx] = position in which this launch ran among all stamps on `counter`.
extern "C" __global__ void xp_stamp(unsigned* counter, unsigned* out, unsigned idx) {
    if (threadIdx.x == 0 && blockIdx.x == 0) out[idx] = atomicAdd(counter, 1u);
}
