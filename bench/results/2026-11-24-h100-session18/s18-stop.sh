#!/bin/bash
set -u
exec > >(tee $OUT/log.txt) 2>&1
D=bench/results/2026-11-24-h100-session18
export PATH=/usr/local/cuda/bin:$PATH
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O2 -o /tmp/stopprobe $D/stopprobe.cu -lcuda || exit 1
for h in copy memset memset-first; do /tmp/stopprobe $h ts; done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/s18-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/s18-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started"
trap 'echo quit | nvidia-cuda-mps-control' EXIT
for h in copy memset memset-first; do /tmp/stopprobe $h mps; done
