#!/usr/bin/env python3
"""Latency-critical inference with Poisson arrivals, an unmodified PyTorch program.

Models (random weights, nothing downloaded):
  resnet50        torchvision ResNet-50, batch 96 by default, fp16, channels-last, CUDA-graph
                  replay: the GPU-bound case.
  resnet50-eager  the same model eager, batch 1: the launch-bound sanity case.
  gpt2            a GPT-2-sized decoder (transformers GPT2LMHeadModel from a default config),
                  one forward step over --seq tokens, CUDA graph if capture works, else eager.

A request = copy the input in (pinned host -> device) + graph replay (or eager forward) + copy
the output out + synchronize. Arrivals are open-loop Poisson at --rate requests/s (or, without
--rate, at the rate that makes the GPU busy --util of the time, from a closed-loop calibration
of the service time). Latency is counted from the arrival, so queueing behind a slow request
counts; the service time (request start to completion) is reported beside it. u = (requests x
calibrated service time) / wall time of the window: the fraction of the
time the inference keeps the GPU busy (meaningful in the run alone).

Output (JSON, --out): latency stats (p50/p99/p999/mean), service-time stats, count, rate, u,
the window [t_start, t_end] on CLOCK_MONOTONIC, every latency (for CDF plots), and the SHA-256
of the output of a fixed input (identical with and without an interposer).
"""

import argparse
import hashlib
import os
import random
import time

from common import StopFlag, latency_stats, log, now, touch, wait_for_files, write_json


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["resnet50", "resnet50-eager", "gpt2"], default="resnet50")
    p.add_argument("--batch", type=int, help="default: 96 resnet50, 1 resnet50-eager, 8 gpt2")
    p.add_argument("--seq", type=int, default=256, help="gpt2 tokens per request")
    p.add_argument("--graph", choices=["auto", "on", "off"], default="auto",
                   help="CUDA-graph replay (auto: on except resnet50-eager)")
    p.add_argument("--rate", type=float, help="Poisson arrival rate, requests/s")
    p.add_argument("--util", type=float, default=0.4, help="target busy fraction when --rate is not given")
    p.add_argument("--duration", type=float, default=20.0, help="measured window, s")
    p.add_argument("--warmup", type=int, default=20, help="untimed requests before calibration")
    p.add_argument("--calib", type=int, default=50, help="closed-loop requests to calibrate the service time")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--arrival-seed", type=int,
                   help="seed of the Poisson arrivals (default: --seed); replicas of one service differ only here")
    p.add_argument("--start-after", action="append", default=[],
                   help="wait for this file before the measured window (repeatable)")
    p.add_argument("--ready-file", help="touched once warmed up and calibrated")
    p.add_argument("--out", help="JSON output (default: stdout)")
    p.add_argument("--tag", default="", help="free text copied into the JSON")
    return p.parse_args()


def build(args, torch):
    """Returns (run_request, output_digest, info)."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(args.seed)
    info = {}
    if args.model.startswith("resnet50"):
        import torchvision

        batch = args.batch or (1 if args.model == "resnet50-eager" else 96)
        model = torchvision.models.resnet50(weights=None).eval().to(dev, torch.float16)
        model = model.to(memory_format=torch.channels_last)
        host_in = torch.randn(batch, 3, 224, 224, generator=g).half().pin_memory()
        static_in = torch.empty_like(host_in, device=dev).contiguous(memory_format=torch.channels_last)
        forward = lambda: model(static_in)  # noqa: E731
        want_graph = args.graph == "on" or (args.graph == "auto" and args.model == "resnet50")
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        batch = args.batch or 8
        cfg = GPT2Config()  # 124M parameters: 12 layers, 768 wide, 50257 vocabulary
        model = GPT2LMHeadModel(cfg).eval().to(dev, torch.float16)
        host_in = torch.randint(0, cfg.vocab_size, (batch, args.seq), generator=g).pin_memory()
        static_in = torch.empty_like(host_in, device=dev)
        forward = lambda: model(input_ids=static_in, use_cache=False).logits[:, -1, :]  # noqa: E731
        want_graph = args.graph in ("on", "auto")
    info["batch"] = batch
    nparams = sum(p.numel() for p in model.parameters())
    info["parameters"] = nparams

    side = torch.cuda.Stream()
    with torch.inference_mode():
        static_in.copy_(host_in)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                out = forward()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = None
        if want_graph:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = forward()
                torch.cuda.synchronize()
            except Exception as e:  # capture can fail for some models; say so and run eager
                log(f"CUDA graph capture failed ({type(e).__name__}: {e}); running eager")
                info["graph_error"] = f"{type(e).__name__}: {e}"[:300]
                graph = None
                torch.cuda.synchronize()
        info["graph"] = graph is not None
    host_out = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
    stream = torch.cuda.current_stream()

    def run_request():
        with torch.inference_mode():
            static_in.copy_(host_in, non_blocking=True)
            if graph is not None:
                graph.replay()
                result = out
            else:
                result = forward()
            host_out.copy_(result, non_blocking=True)
            stream.synchronize()

    def output_digest():
        run_request()
        return hashlib.sha256(host_out.numpy().tobytes()).hexdigest()

    return run_request, output_digest, info


def main():
    args = parse_args()
    stop = StopFlag()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.manual_seed(args.seed)
    t_build = now()
    run_request, output_digest, info = build(args, torch)
    for _ in range(args.warmup):
        run_request()
    calib = []
    for _ in range(args.calib):
        t0 = now()
        run_request()
        calib.append(now() - t0)
    calib.sort()
    service_s = calib[len(calib) // 2]
    rate = args.rate if args.rate else args.util / service_s
    digest = output_digest()
    log(f"{args.model} batch {info['batch']} graph={info['graph']}: service {service_s * 1e3:.3f} ms, "
        f"rate {rate:.1f}/s, setup {now() - t_build:.1f} s")
    touch(args.ready_file)
    if not wait_for_files(args.start_after, stop):
        log("gave up waiting for", args.start_after)

    rng = random.Random(args.seed if args.arrival_seed is None else args.arrival_seed)
    latencies, services = [], []
    t_start = now()
    arrival = t_start + rng.expovariate(rate)
    end = t_start + args.duration
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
        arrival += rng.expovariate(rate)
    t_end = now()
    wall = t_end - t_start
    result = {
        "program": "infer",
        "tag": args.tag,
        "model": args.model,
        "args": vars(args),
        **info,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "service_calib_ms": round(service_s * 1e3, 4),
        "rate_per_s": rate,
        "t_start": t_start,
        "t_end": t_end,
        "wall_s": wall,
        "stopped_early": stop.stop,
        "latency": latency_stats(latencies),
        "service": latency_stats(services),
        # busy fraction of the window: requests x service time alone / wall time
        "u": len(latencies) * service_s / wall if wall > 0 else float("nan"),
        "u_measured": sum(services) / wall if wall > 0 else float("nan"),
        "output_sha256": digest,
        "latencies_ms": [round(x * 1e3, 4) for x in latencies],
        "services_ms": [round(x * 1e3, 4) for x in services],
    }
    write_json(args.out, result)
    log(f"{len(latencies)} requests: p50 {result['latency']['p50_ms']} ms, p99 {result['latency']['p99_ms']} ms, "
        f"u {result['u']:.3f}")


if __name__ == "__main__":
    main()
