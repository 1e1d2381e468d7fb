"""PyTorch under the shim: eager matmuls and convolutions, a CUDA graph capture and replays,
a few training steps, stream and event use; prints a checksum of every result, which must be
identical natively and under `xpreempt run` (any level, with or without chaos)."""
import hashlib
import sys

import torch

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
h = hashlib.sha256()


def add(t):
    h.update(t.detach().float().cpu().numpy().tobytes())


a = torch.randn(1024, 1024, device=dev)
b = torch.randn(1024, 1024, device=dev)
for _ in range(20):
    a = torch.tanh(a @ b)
add(a)

conv = torch.nn.Conv2d(16, 32, 3, padding=1).to(dev)
x = torch.randn(8, 16, 64, 64, device=dev)
add(conv(x))

# A CUDA graph: captured on a side stream, replayed on the default stream.
static_in = torch.randn(256, 256, device=dev)
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        static_out = torch.relu(static_in @ static_in)
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    static_out = torch.relu(static_in @ static_in)
for i in range(50):
    static_in.copy_(torch.full((256, 256), float(i % 7) / 10, device=dev))
    g.replay()
    add(static_out)

# Training steps.
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    xb = torch.randn(64, 512, device=dev)
    yb = torch.randint(0, 10, (64,), device=dev)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
for p in model.parameters():
    add(p)

# Streams and events across them.
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
with torch.cuda.stream(s1):
    y = torch.randn(2048, 2048, device=dev)
    for _ in range(5):
        y = y @ y / 2048
    ev = torch.cuda.Event()
    ev.record(s1)
with torch.cuda.stream(s2):
    s2.wait_event(ev)
    z = y.sum(dim=0)
torch.cuda.synchronize()
add(z)
print(h.hexdigest())
sys.exit(0)
