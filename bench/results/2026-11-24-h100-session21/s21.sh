#!/bin/bash
# Session 21's runs: session 20's s20.sh as it is, but for where the builds are (.carry21/<name>/)
# and its scratch folder (/tmp/s21). From the repository root; STEPS, VARIANTS and the rest are
# s20.sh's. (The device ran a full copy of the result, which differed only in its comment.)
S20=bench/results/2026-11-24-h100-session20/s20.sh
exec bash <(sed 's#/\.carry19; R=/tmp/s20#/.carry21; R=/tmp/s21#' "$S20")
