#!/usr/bin/env python3
"""Best-effort training with long kernels, an unmodified PyTorch program.

torchvision ResNet-50 (random weights), batch 256 by default, bf16 autocast, channels-last, SGD
with momentum, on a fixed pool of synthetic batches. Fixed seeds and deterministic algorithms, so
the SHA-256 of the weights after --check-steps steps is identical run to run and must stay
identical under an interposer. (Two layers whose backward PyTorch implements with atomics are
replaced by deterministic equivalents of the same shape: the 3x3/2 max pool by a 2x2/2 max pool,
the adaptive average pool by a mean; ViT's attention runs on the math backend; anything else
PyTorch flags is listed in the JSON.)

With $XP_GREEN_KEEP_FREE and $XP_GREEN_LIB (libgreen.so of bench/cuda/green_probe.cu) the steps run
on a stream of a green context holding all SMs but that many (SM confinement).

Runs until SIGTERM/SIGINT or --duration, recording the CLOCK_MONOTONIC time at which each step
completed, so an orchestrator can compute the throughput inside any window. Touches --ready-file
after --warmup-steps.
"""

import argparse
import contextlib
import hashlib
import os
import warnings

from common import StopFlag, log, now, touch, write_json


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["resnet50", "resnet152", "vit_b_16"], default="resnet50")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--duration", type=float, default=600.0, help="upper bound, s (normally ended by SIGTERM)")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--check-steps", type=int, default=20, help="weights checksum after this many steps")
    p.add_argument("--sync-every", type=int, default=1, help="synchronize (and timestamp) every N steps")
    p.add_argument("--pool", type=int, default=4, help="distinct synthetic batches")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ready-file")
    p.add_argument("--out")
    p.add_argument("--tag", default="")
    return p.parse_args()


def make_model(args, torch):
    import torchvision

    nn = torch.nn
    model = getattr(torchvision.models, args.model)(weights=None)
    if args.model.startswith("resnet"):
        model.maxpool = nn.MaxPool2d(kernel_size=2, stride=2)  # no overlapping windows

        class Mean(nn.Module):
            def forward(self, x):
                return x.mean(dim=(2, 3), keepdim=True)

        model.avgpool = Mean()
    return model


def weights_sha256(model):
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    stop = StopFlag()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.manual_seed(args.seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    # ViT's attention on the math backend: the flash and memory-efficient backward passes are
    # not deterministic, and warn_only only warns. ViT's weights still differed from the other
    # runs' in 2 of 28 runs on an H200, one of them alone (docs/results/h200-torch-pairs.md).
    for backend in ("flash", "mem_efficient", "cudnn"):
        getattr(torch.backends.cuda, f"enable_{backend}_sdp", lambda _on: None)(False)
    flagged = set()
    warnings.simplefilter("always")
    orig_showwarning = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if "deterministic" in text:
            flagged.add(text.split(".")[0][:160])
        else:
            orig_showwarning(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning

    dev = torch.device("cuda")
    model = make_model(args, torch).to(dev).to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator(device=dev).manual_seed(args.seed)
    inputs = [torch.randn(args.batch, 3, 224, 224, device=dev, generator=g).contiguous(memory_format=torch.channels_last)
              for _ in range(args.pool)]
    labels = [torch.randint(0, 1000, (args.batch,), device=dev, generator=g) for _ in range(args.pool)]

    # Confinement: every step on a green-context stream (torch.cuda.ExternalStream).
    green_sms, run_on = None, None
    if os.environ.get("XP_GREEN_KEEP_FREE"):
        import ctypes

        lib = ctypes.CDLL(os.environ["XP_GREEN_LIB"])
        lib.green_stream.restype = ctypes.c_void_p
        lib.green_stream.argtypes = [ctypes.c_int] * 3 + [ctypes.POINTER(ctypes.c_int)] * 2
        rc, sms = ctypes.c_int(0), ctypes.c_int(0)
        ptr = lib.green_stream(int(os.environ["XP_GREEN_KEEP_FREE"]), 0, 0, ctypes.byref(rc), ctypes.byref(sms))
        if not ptr:
            raise SystemExit(f"green context: CUresult {rc.value}")
        green_sms, run_on = sms.value, torch.cuda.ExternalStream(ptr)
        torch.cuda.synchronize()  # the setup above ran on the default stream
        log(f"steps on a green-context stream of {green_sms} SMs")

    def sync():
        if run_on is not None:
            run_on.synchronize()
        torch.cuda.synchronize()

    def step(i):
        with torch.cuda.stream(run_on) if run_on is not None else contextlib.nullcontext():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(inputs[i % args.pool]), labels[i % args.pool])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    t_begin = now()
    step_end = []  # CLOCK_MONOTONIC completion time of every synchronized step
    step_index = []
    checksum = None
    loss_at_check = None
    t_ready = None
    i = 0
    # A stop request still lets the run reach --check-steps, so every run has a checksum.
    while ((not stop.stop or i < args.check_steps) and now() - t_begin < args.duration
           and (not args.max_steps or i < args.max_steps)):
        loss = step(i)
        i += 1
        if i % args.sync_every == 0 or i == args.check_steps:
            sync()
            step_end.append(now())
            step_index.append(i)
        if i == args.check_steps:
            checksum = weights_sha256(model)
            loss_at_check = float(loss)
        if i == args.warmup_steps:
            t_ready = now()
            touch(args.ready_file)
    sync()
    t_stop = now()
    after = [(t, k) for t, k in zip(step_end, step_index) if t_ready is not None and t > t_ready]
    sps = None
    if after and t_ready is not None:
        sps = (after[-1][1] - args.warmup_steps) / (after[-1][0] - t_ready)
    result = {
        "program": "train",
        "tag": args.tag,
        "model": args.model,
        "args": vars(args),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "steps": i,
        "green_sms": green_sms,
        "t_ready": t_ready,
        "t_stop": t_stop,
        "steps_per_s_after_warmup": sps,
        "images_per_s_after_warmup": sps * args.batch if sps else None,
        "check_steps": args.check_steps,
        "weights_sha256": checksum,
        "loss_at_check": loss_at_check,
        "nondeterministic_ops_flagged": sorted(flagged),
        "step_end": step_end,
        "step_index": step_index,
    }
    write_json(args.out, result)
    log(f"{i} steps, {sps and round(sps, 3)} steps/s after warmup, weights@{args.check_steps} {checksum and checksum[:16]}")


if __name__ == "__main__":
    main()
