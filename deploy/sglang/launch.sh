#!/usr/bin/env bash
# One SGLang replica the way kvroute wants it: HiCache in write_back mode, cache reports and metrics on.
#
#   set -a; . deploy/sglang/dense-1gpu.env; set +a; deploy/sglang/launch.sh
#   DRY_RUN=1 deploy/sglang/launch.sh      # print the command line (one argument per line), start nothing
#
# Settings come from the environment (the *.env files beside this script are worked examples):
#   MODEL_PATH (required)  SERVED_MODEL_NAME  HOST (0.0.0.0)  PORT (30000)  TP_SIZE (1)
#   KV_CACHE_DTYPE (fp8_e4m3)  CHUNKED_PREFILL_SIZE (4096)  MAX_PREFILL_TOKENS (16384)
#   MEM_FRACTION_STATIC  MAX_RUNNING_REQUESTS  CONTEXT_LENGTH  PAGE_SIZE        (SGLang's defaults if unset)
#   HICACHE_RATIO (2)  or  HICACHE_SIZE_GB (overrides the ratio)  HICACHE_IO_BACKEND (kernel)
#   HICACHE_STORAGE_DIR    set: the `file` L3 backend writes there (survives restarts; SGLang reads it
#                          from SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR, default /tmp/hicache)
#   EXTRA_ARGS             more SGLang flags, split on spaces (e.g. speculative decoding, mamba sizes)
#   DISAGGREGATION_MODE    null (default: an ordinary replica), prefill or decode (a prefill/decode fleet,
#                          docs/pd.md); then TRANSFER_BACKEND (mooncake), IB_DEVICE (e.g. mlx5_0,mlx5_1;
#                          unset: detected) and, on a prefill server, BOOTSTRAP_PORT (8998). A decode
#                          server runs without HiCache: SGLang forces it to a chunk cache and refuses
#                          --enable-hierarchical-cache there (pd-contract.md §2.1, §2.8)
#   SGLANG_PYTHON (python3)
#
# Why these flags (two practitioners' reports; docs/operations.md "Sizing a replica" has their numbers):
# - --hicache-write-policy write_back: on a hybrid GDN+attention model, write_through (SGLang's default)
#   filled the host pool (592,658 of 709,577 tokens) but a 40K-token context re-sent after eviction
#   pressure took 15.4 s, as long as cold; with write_back the same probe took 0.4 s (38x), 0.1 s once
#   back on the GPU. write_back copies a node to host when it is evicted from the GPU, with its state.
# - --enable-cache-report: usage.prompt_tokens_details.cached_tokens, which kvroute learns from.
# - --enable-metrics: /metrics (sglang:hicache_host_used_tokens, sglang:cached_tokens_total{cache_source}).
# - fp8_e4m3 KV: half the bytes of bf16 per token (twice the tokens per pool); seed 1 measured +25-30%
#   single-stream speed over fp8_e5m2. Chunked prefill 4096 / max prefill 16384: +4-8.5% batch prefill
#   over 2048 / 8192 in seed 1.
# - memory: the host pool is allocated at start, per TP rank: ratio x the GPU KV pool (in tokens, so in
#   bytes too), or HICACHE_SIZE_GB; it must be larger than the GPU pool (SGLang asserts it) and SGLang
#   keeps 10 GB of host RAM free. HiCache also costs ~31% of the GPU KV capacity (seed 2: 233,207 ->
#   159,692 tokens) and ~3% decode speed (133 vs 137 tokens/s). See the .env files for worked sizes.
set -euo pipefail

: "${MODEL_PATH:?set MODEL_PATH (a local path or a Hugging Face model id)}"

args=(
  --model-path "$MODEL_PATH"
  --host "${HOST:-0.0.0.0}"
  --port "${PORT:-30000}"
  --tp-size "${TP_SIZE:-1}"
  --kv-cache-dtype "${KV_CACHE_DTYPE:-fp8_e4m3}"
  --chunked-prefill-size "${CHUNKED_PREFILL_SIZE:-4096}"
  --max-prefill-tokens "${MAX_PREFILL_TOKENS:-16384}"
  --enable-cache-report
  --enable-metrics
)
mode="${DISAGGREGATION_MODE:-null}"
case "$mode" in
  null | prefill | decode) ;;
  *) echo "DISAGGREGATION_MODE must be null, prefill or decode, not '$mode'" >&2; exit 2 ;;
esac
if [[ "$mode" != decode ]]; then
  args+=(--enable-hierarchical-cache --hicache-write-policy write_back)
  args+=(--hicache-io-backend "${HICACHE_IO_BACKEND:-kernel}")
  if [[ -n "${HICACHE_SIZE_GB:-}" ]]; then
    args+=(--hicache-size "$HICACHE_SIZE_GB")
  else
    args+=(--hicache-ratio "${HICACHE_RATIO:-2}")
  fi
  if [[ -n "${HICACHE_STORAGE_DIR:-}" ]]; then
    export SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR="$HICACHE_STORAGE_DIR"
    args+=(--hicache-storage-backend file)
  fi
fi
if [[ "$mode" != null ]]; then
  args+=(--disaggregation-mode "$mode" --disaggregation-transfer-backend "${TRANSFER_BACKEND:-mooncake}")
  if [[ "$mode" == prefill ]]; then
    args+=(--disaggregation-bootstrap-port "${BOOTSTRAP_PORT:-8998}")
  fi
  if [[ -n "${IB_DEVICE:-}" ]]; then
    args+=(--disaggregation-ib-device "$IB_DEVICE")
  fi
fi
optional=(
  SERVED_MODEL_NAME:--served-model-name MEM_FRACTION_STATIC:--mem-fraction-static
  MAX_RUNNING_REQUESTS:--max-running-requests CONTEXT_LENGTH:--context-length PAGE_SIZE:--page-size
)
for pair in "${optional[@]}"; do
  name="${pair%%:*}"
  if [[ -n "${!name:-}" ]]; then
    args+=("${pair#*:}" "${!name}")
  fi
done
read -r -a extra <<< "${EXTRA_ARGS:-}"
args+=("${extra[@]}")

command=("${SGLANG_PYTHON:-python3}" -m sglang.launch_server "${args[@]}")
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%s\n' "${command[@]}"
  exit 0
fi
if [[ -n "${HICACHE_STORAGE_DIR:-}" && "$mode" != decode ]]; then
  mkdir -p "$HICACHE_STORAGE_DIR"
fi
exec "${command[@]}"
