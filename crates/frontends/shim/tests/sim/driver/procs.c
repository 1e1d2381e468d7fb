/* cuGetProcAddress: how the CUDA runtime finds every entry point (the version the request's
 * version asks for, and the per-thread default stream variant when asked for it). The entries
 * are the driver's own exports, so the shim recognizes each by its address. */
#define _GNU_SOURCE
#include "sim.h"
#include <string.h>

/* Only their addresses are taken here. */
void cuInit(void);
void cuDriverGetVersion(void);
void cuDeviceGet(void);
void cuDeviceGetCount(void);
void cuDevicePrimaryCtxRetain(void);
void cuDevicePrimaryCtxRelease(void);
void cuDevicePrimaryCtxRelease_v2(void);
void cuDevicePrimaryCtxReset(void);
void cuDevicePrimaryCtxReset_v2(void);
void cuCtxCreate_v2(void);
void cuCtxDestroy_v2(void);
void cuCtxSetCurrent(void);
void cuCtxGetCurrent(void);
void cuCtxPushCurrent_v2(void);
void cuCtxPopCurrent_v2(void);
void cuCtxGetDevice(void);
void cuCtxSynchronize(void);
void cuStreamCreate(void);
void cuStreamCreateWithPriority(void);
void cuStreamDestroy_v2(void);
void cuStreamSynchronize(void);
void cuStreamSynchronize_ptsz(void);
void cuStreamQuery(void);
void cuStreamQuery_ptsz(void);
void cuStreamWaitEvent(void);
void cuStreamWaitEvent_ptsz(void);
void cuStreamGetFlags(void);
void cuStreamGetFlags_ptsz(void);
void cuStreamGetCtx(void);
void cuStreamGetCtx_ptsz(void);
void cuStreamIsCapturing(void);
void cuStreamIsCapturing_ptsz(void);
void cuStreamBeginCapture_v2(void);
void cuStreamBeginCapture_v2_ptsz(void);
void cuStreamEndCapture(void);
void cuStreamEndCapture_ptsz(void);
void cuThreadExchangeStreamCaptureMode(void);
void cuLaunchHostFunc(void);
void cuLaunchHostFunc_ptsz(void);
void cuEventCreate(void);
void cuEventDestroy_v2(void);
void cuEventRecord(void);
void cuEventRecord_ptsz(void);
void cuEventQuery(void);
void cuEventSynchronize(void);
void cuMemAlloc_v2(void);
void cuMemFree_v2(void);
void cuMemcpyHtoD_v2(void);
void cuMemcpyHtoD_v2_ptds(void);
void cuMemcpyDtoH_v2(void);
void cuMemcpyDtoH_v2_ptds(void);
void cuMemsetD32_v2(void);
void cuMemsetD32_v2_ptds(void);
void cuMemcpyHtoDAsync_v2(void);
void cuMemcpyHtoDAsync_v2_ptsz(void);
void cuMemcpyDtoHAsync_v2(void);
void cuMemcpyDtoHAsync_v2_ptsz(void);
void cuMemsetD32Async(void);
void cuMemsetD32Async_ptsz(void);
void cuModuleLoadData(void);
void cuModuleGetFunction(void);
void cuModuleUnload(void);
void cuLibraryLoadData(void);
void cuLibraryGetKernel(void);
void cuLibraryUnload(void);
void cuFuncGetParamInfo(void);
void cuKernelGetParamInfo(void);
void cuLaunchKernel(void);
void cuLaunchKernel_ptsz(void);
void cuLaunchKernelEx(void);
void cuLaunchKernelEx_ptsz(void);
void cuLaunchCooperativeKernel(void);
void cuLaunchCooperativeKernel_ptsz(void);
void cuGraphInstantiateWithFlags(void);
void cuGraphLaunch(void);
void cuGraphLaunch_ptsz(void);
void cuGraphExecDestroy(void);
void cuGraphDestroy(void);
CUresult cuGetProcAddress_v2(const char *name, void **pfn, int version, unsigned long long flags, int *status);

#define PER_THREAD_DEFAULT_STREAM 2ull
#define E(name, fn, fn_pt) {name, (void *)(fn), (void *)(fn_pt)}
/* What cuGetProcAddress hands out for each name the runtime asks for: the newest version, and
 * the per-thread variant when asked for per-thread default stream semantics. */
static const struct {
    const char *name;
    void *fn, *per_thread;
} table[] = {
    E("cuInit", cuInit, 0),
    E("cuGetProcAddress", cuGetProcAddress_v2, 0),
    E("cuDriverGetVersion", cuDriverGetVersion, 0),
    E("cuDeviceGet", cuDeviceGet, 0),
    E("cuDeviceGetCount", cuDeviceGetCount, 0),
    E("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 0),
    E("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 0),
    E("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2, 0),
    E("cuCtxCreate", cuCtxCreate_v2, 0),
    E("cuCtxDestroy", cuCtxDestroy_v2, 0),
    E("cuCtxSetCurrent", cuCtxSetCurrent, 0),
    E("cuCtxGetCurrent", cuCtxGetCurrent, 0),
    E("cuCtxPushCurrent", cuCtxPushCurrent_v2, 0),
    E("cuCtxPopCurrent", cuCtxPopCurrent_v2, 0),
    E("cuCtxGetDevice", cuCtxGetDevice, 0),
    E("cuCtxSynchronize", cuCtxSynchronize, 0),
    E("cuStreamCreate", cuStreamCreate, 0),
    E("cuStreamCreateWithPriority", cuStreamCreateWithPriority, 0),
    E("cuStreamDestroy", cuStreamDestroy_v2, 0),
    E("cuStreamSynchronize", cuStreamSynchronize, cuStreamSynchronize_ptsz),
    E("cuStreamQuery", cuStreamQuery, cuStreamQuery_ptsz),
    E("cuStreamWaitEvent", cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    E("cuStreamGetFlags", cuStreamGetFlags, cuStreamGetFlags_ptsz),
    E("cuStreamGetCtx", cuStreamGetCtx, cuStreamGetCtx_ptsz),
    E("cuStreamIsCapturing", cuStreamIsCapturing, cuStreamIsCapturing_ptsz),
    E("cuStreamBeginCapture", cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
    E("cuStreamEndCapture", cuStreamEndCapture, cuStreamEndCapture_ptsz),
    E("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode, 0),
    E("cuLaunchHostFunc", cuLaunchHostFunc, cuLaunchHostFunc_ptsz),
    E("cuEventCreate", cuEventCreate, 0),
    E("cuEventDestroy", cuEventDestroy_v2, 0),
    E("cuEventRecord", cuEventRecord, cuEventRecord_ptsz),
    E("cuEventQuery", cuEventQuery, 0),
    E("cuEventSynchronize", cuEventSynchronize, 0),
    E("cuMemAlloc", cuMemAlloc_v2, 0),
    E("cuMemFree", cuMemFree_v2, 0),
    E("cuMemcpyHtoD", cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
    E("cuMemcpyDtoH", cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    E("cuMemsetD32", cuMemsetD32_v2, cuMemsetD32_v2_ptds),
    E("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    E("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    E("cuMemsetD32Async", cuMemsetD32Async, cuMemsetD32Async_ptsz),
    E("cuModuleLoadData", cuModuleLoadData, 0),
    E("cuModuleGetFunction", cuModuleGetFunction, 0),
    E("cuModuleUnload", cuModuleUnload, 0),
    E("cuLibraryLoadData", cuLibraryLoadData, 0),
    E("cuLibraryGetKernel", cuLibraryGetKernel, 0),
    E("cuLibraryUnload", cuLibraryUnload, 0),
    E("cuFuncGetParamInfo", cuFuncGetParamInfo, 0),
    E("cuKernelGetParamInfo", cuKernelGetParamInfo, 0),
    E("cuLaunchKernel", cuLaunchKernel, cuLaunchKernel_ptsz),
    E("cuLaunchKernelEx", cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
    E("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz),
    E("cuGraphInstantiate", cuGraphInstantiateWithFlags, 0),
    E("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, 0),
    E("cuGraphLaunch", cuGraphLaunch, cuGraphLaunch_ptsz),
    E("cuGraphExecDestroy", cuGraphExecDestroy, 0),
    E("cuGraphDestroy", cuGraphDestroy, 0),
};

/* Entry points whose newer version came with a CUDA version: a request for an older version
 * gets the first one (the CUDA 13.0 runtime asks for these two at version 7000). */
static const struct {
    const char *name;
    void *first;
    int newer_since;
} first_versions[] = {
    {"cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease, 11000},
    {"cuDevicePrimaryCtxReset", (void *)cuDevicePrimaryCtxReset, 11000},
};

CUresult cuGetProcAddress_v2(const char *name, void **pfn, int version, unsigned long long flags, int *status) {
    ENTER("cuGetProcAddress_v2");
    for (size_t i = 0; i < sizeof first_versions / sizeof first_versions[0]; i++) {
        if (strcmp(first_versions[i].name, name) || version >= first_versions[i].newer_since) continue;
        *pfn = first_versions[i].first;
        if (status) *status = 0;
        return OK;
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, name)) continue;
        *pfn = (flags & PER_THREAD_DEFAULT_STREAM) && table[i].per_thread ? table[i].per_thread : table[i].fn;
        if (status) *status = 0;
        return OK;
    }
    *pfn = NULL;
    if (status) *status = 1;
    return E_NOT_FOUND;
}
CUresult cuGetProcAddress(const char *name, void **pfn, int version, unsigned long long flags) {
    return cuGetProcAddress_v2(name, pfn, version, flags, NULL);
}
