#!/bin/bash
set -u
exec > >(tee $OUT/log.txt) 2>&1
D=bench/results/2026-11-24-h100-session18
export PATH=/usr/local/cuda/bin:$PATH
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O2 -o /tmp/driverprobe $D/driverprobe.cu -lcuda || exit 1
for i in 1 2; do for h in copy memset write; do /tmp/driverprobe 2 ts-$i $h; done; done
export CUDA_MPS_PIPE_DIRECTORY=/tmp/s18-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/s18-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started"
trap 'echo quit | nvidia-cuda-mps-control' EXIT
for i in 1 2; do for h in copy memset write; do CUDA_DEVICE_MAX_CONNECTIONS=32 /tmp/driverprobe 2 mps32-$i $h; done; done
