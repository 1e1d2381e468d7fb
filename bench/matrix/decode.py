#!/usr/bin/env python3
"""Latency-critical transformer decoding, eager: the launch-bound LC of the workload matrix.

GPT-2 small (transformers GPT2LMHeadModel from the default GPT2Config, random weights, fp16,
nothing downloaded). A request = copy a batch of prompts in, one prefill forward, then greedy
decode steps with the KV cache (one eager forward and an argmax per token), copy the tokens out,
synchronize. Every step launches a few hundred small kernels from Python, so the GPU waits on the
CPU most of the time.

Arrivals: open-loop Poisson at --rate (or at --util / calibrated service time, as
bench/pytorch/infer.py does), or --closed (the next request starts when one ends). Latency is
counted from the arrival, service time from the request's start. The JSON has the keys of
infer.py's (latencies_ms, services_ms, t_start, t_end, u, output_sha256, ...) and u_gpu: the
GPU's busy fraction, from the kernels' own durations (torch.profiler over a few calibration
requests, with --gpu-time), else null.
"""

import argparse
import hashlib
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pytorch"))
from common import StopFlag, log, now, touch, wait_for_files, write_json  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--tokens", type=int, default=16, help="tokens generated per request")
    p.add_argument("--rate", type=float, help="Poisson arrival rate, requests/s")
    p.add_argument("--util", type=float, default=0.5, help="busy fraction (by service time) when --rate is not given")
    p.add_argument("--closed", action="store_true", help="closed loop: no arrivals, back-to-back requests")
    p.add_argument("--duration", type=float, default=20.0, help="measured window, s")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--calib", type=int, default=10)
    p.add_argument("--gpu-time", action="store_true", help="measure the kernels' GPU time with torch.profiler")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--arrival-seed", type=int, help="seed of the arrivals (default: --seed)")
    p.add_argument("--start-after", action="append", default=[])
    p.add_argument("--ready-file")
    p.add_argument("--out")
    p.add_argument("--tag", default="")
    return p.parse_args()


def build(args, torch):
    from transformers import GPT2Config, GPT2LMHeadModel

    dev = torch.device("cuda")
    cfg = GPT2Config()  # 124M parameters: 12 layers, 768 wide, 50257 vocabulary
    with dev:  # parameters initialized on the GPU: seconds faster than on the CPU
        model = GPT2LMHeadModel(cfg).eval().to(torch.float16)
    g = torch.Generator().manual_seed(args.seed)
    host_in = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), generator=g).pin_memory()
    prompt = torch.empty_like(host_in, device=dev)
    host_out = torch.empty((args.batch, args.tokens), dtype=torch.long, pin_memory=True)
    stream = torch.cuda.current_stream()

    def run_request():
        with torch.inference_mode():
            prompt.copy_(host_in, non_blocking=True)
            out = model(input_ids=prompt, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            toks = [tok]
            for _ in range(args.tokens - 1):
                out = model(input_ids=tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
                toks.append(tok)
            host_out.copy_(torch.cat(toks, dim=1), non_blocking=True)
            stream.synchronize()

    def output_digest():
        run_request()
        return hashlib.sha256(host_out.numpy().tobytes()).hexdigest()

    return run_request, output_digest, sum(p.numel() for p in model.parameters())


def kernel_seconds(torch, run_request, n):
    """GPU time of n requests' kernels and copies, summed from the profiler's device events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            run_request()
    total_us = 0.0
    for e in prof.events():
        dev_type = str(getattr(e, "device_type", ""))
        if dev_type.endswith("CUDA"):
            total_us += e.time_range.elapsed_us()
    return total_us * 1e-6 / n if total_us > 0 else None


def main():
    args = parse_args()
    stop = StopFlag()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    t_build = now()
    run_request, output_digest, nparams = build(args, torch)
    for _ in range(args.warmup):
        run_request()
    calib = []
    for _ in range(args.calib):
        t0 = now()
        run_request()
        calib.append(now() - t0)
    calib.sort()
    service_s = calib[len(calib) // 2]
    gpu_s, gpu_error = None, None
    if args.gpu_time:
        try:
            gpu_s = kernel_seconds(torch, run_request, 3)
        except Exception as e:  # the profiler is a measurement aid: its absence is reported, not fatal
            gpu_error = f"{type(e).__name__}: {e}"[:300]
    rate = args.rate if args.rate else args.util / service_s
    digest = output_digest()
    log(f"gpt2 decode b{args.batch} {args.prompt}+{args.tokens}: service {service_s * 1e3:.2f} ms, "
        f"gpu {gpu_s and round(gpu_s * 1e3, 2)} ms, rate {rate:.1f}/s, setup {now() - t_build:.1f} s")
    touch(args.ready_file)
    if not wait_for_files(args.start_after, stop):
        log("gave up waiting for", args.start_after)

    rng = random.Random(args.seed if args.arrival_seed is None else args.arrival_seed)
    latencies, services = [], []
    t_start = now()
    end = t_start + args.duration
    arrival = t_start if args.closed else t_start + rng.expovariate(rate)
    while arrival < end and not stop.stop:
        wait = arrival - now()
        if wait > 0.0005:
            time.sleep(wait - 0.0003)
        while now() < arrival:
            pass
        begin = now()
        run_request()
        done = now()
        latencies.append(done - arrival)
        services.append(done - begin)
        arrival = done if args.closed else arrival + rng.expovariate(rate)
    t_end = now()
    wall = t_end - t_start
    result = {
        "program": "decode",
        "tag": args.tag,
        "args": vars(args),
        "parameters": nparams,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "service_calib_ms": round(service_s * 1e3, 4),
        "gpu_calib_ms": round(gpu_s * 1e3, 4) if gpu_s else None,
        "gpu_time_error": gpu_error,
        "rate_per_s": None if args.closed else rate,
        "closed_loop": args.closed,
        "t_start": t_start,
        "t_end": t_end,
        "wall_s": wall,
        "stopped_early": stop.stop,
        "count": len(latencies),
        "u": len(latencies) * service_s / wall if wall > 0 else None,
        "u_gpu": len(latencies) * gpu_s / wall if wall > 0 and gpu_s else None,
        "output_sha256": digest,
        "latencies_ms": [round(x * 1e3, 4) for x in latencies],
        "services_ms": [round(x * 1e3, 4) for x in services],
    }
    write_json(args.out, result)
    log(f"{len(latencies)} requests in {wall:.1f} s")


if __name__ == "__main__":
    main()
