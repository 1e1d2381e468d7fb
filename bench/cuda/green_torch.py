"""PyTorch's own kernels (cuBLAS, cuDNN, ATen) on a green-context stream.

Makes green-context streams with libgreen.so (bench/cuda/green_probe.cu built with -DGREEN_LIB),
wraps them in torch.cuda.ExternalStream and runs a half-precision matmul and ResNet-50 training
steps there: do they run, give the same results as on an ordinary stream, and are they confined
(8 SMs must be much slower than all)? Prints one JSON object per line.
Usage: python3 green_torch.py /path/to/libgreen.so
"""

import ctypes
import json
import sys
import time

import torch


def emit(**kv):
    print(json.dumps(kv), flush=True)


def green_stream(lib, keep_free, part, prio=0):
    rc, sms = ctypes.c_int(0), ctypes.c_int(0)
    ptr = lib.green_stream(keep_free, part, prio, ctypes.byref(rc), ctypes.byref(sms))
    return ptr, rc.value, sms.value


def timed(stream, fn, reps):
    with torch.cuda.stream(stream):
        fn()  # warm-up (cuBLAS/cuDNN handles and workspaces for this stream)
        stream.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            out = fn()
        stream.synchronize()
    return (time.perf_counter() - t) / reps * 1e3, out


def main():
    lib = ctypes.CDLL(sys.argv[1])
    lib.green_stream.restype = ctypes.c_void_p
    lib.green_stream.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                 ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    torch.cuda.init()
    dev = torch.cuda.get_device_properties(0)
    emit(check="torch", version=torch.__version__, device=dev.name, sms=dev.multi_processor_count)
    streams = {"ordinary": torch.cuda.Stream()}
    for name, keep, part in (("green_all_but_8", 8, 0), ("green_8", 8, 1)):
        ptr, rc, sms = green_stream(lib, keep, part)
        emit(check="green_stream", name=name, rc=rc, sms=sms, ok=bool(ptr))
        if ptr:
            streams[name] = torch.cuda.ExternalStream(ptr)

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.half)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.half)
    ref = None
    for name, s in streams.items():
        try:
            ms, out = timed(s, lambda: a @ b, 5)
            same = None if ref is None else bool(torch.equal(out, ref))
            ref = out if ref is None else ref
            emit(check="matmul_8192_half", stream=name, ms=round(ms, 3), same_as_ordinary=same)
        except Exception as e:  # report and go on: the point is which streams work
            emit(check="matmul_8192_half", stream=name, error=repr(e))

    try:
        import torchvision

        torch.manual_seed(0)
        model = torchvision.models.resnet50().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(64, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (64,), device="cuda")
        lossf = torch.nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=True)
            loss = lossf(model(x), y)
            loss.backward()
            opt.step()
            return loss

        for name, s in streams.items():
            try:
                ms, loss = timed(s, step, 5)
                emit(check="resnet50_train_step_b64", stream=name, ms=round(ms, 2),
                     loss_finite=bool(torch.isfinite(loss).item()))
            except Exception as e:
                emit(check="resnet50_train_step_b64", stream=name, error=repr(e))
    except Exception as e:
        emit(check="resnet50_setup", error=repr(e))
    torch.cuda.synchronize()
    emit(check="done")


if __name__ == "__main__":
    main()
