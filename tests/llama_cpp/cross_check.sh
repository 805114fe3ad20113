#!/usr/bin/env bash
# cross_check.sh LLAMACPP_BIN LLAMA_BIN MODELS_DIR OUTDIR: the same token
# files through llama.cpp (with the library's glue) and through the
# project's own decoder (examples/llama): the full cache's and StreamingLLM's
# NLL must agree within 1e-3 nats with llama.cpp's default F16 K/V cache, and
# within 1e-5 with an F32 one (the F16 rounding of K and V is the whole gap;
# examples/llama caches fp32). Decode protocol, one token a step, m = 1;
# then the prefill protocol on stories260K (below). Flash attention off:
# llama.cpp's flash-attention kernel casts an F32 cache to F16 and
# accumulates V in F16, so only the probabilities path computes in F32
# (the flash-attention path is checked against it by run.sh flash).
set -euo pipefail
lc=$1 ll=$2 models=$3 out=$4
status=0 ran=0
for spec in stories260K:256:64 tinystories656k:256:64 babyllama105:200:48; do
  IFS=: read -r name length budget <<<"$spec"
  model=$models/$name.gguf
  if [ ! -f "$model" ]; then echo "note: $model not found, skipped"; continue; fi
  dir=$out/cross_$name; rm -rf "$dir"; mkdir -p "$dir"
  "$lc" evaluate --model "$model" --samples 2 --length "$length" --save-tokens "$dir" --flash-attn off \
    --policies streaming --budget-tokens "$budget" --chunk 1 --csv "$dir/llamacpp.csv" >"$dir/llamacpp.log" 2>&1
  "$lc" evaluate --model "$model" --tokens "$dir"/sample1.tokens "$dir"/sample2.tokens --f32-cache --flash-attn off \
    --policies streaming --budget-tokens "$budget" --chunk 1 --csv "$dir/llamacpp_f32.csv" >"$dir/llamacpp_f32.log" 2>&1
  "$ll" --model "$model" --threads 1 evaluate --tokens "$dir"/sample1.tokens "$dir"/sample2.tokens \
    --policies streaming --budgets "$budget" --csv "$dir/llama.csv" --no-plot >"$dir/llama.log" 2>&1
  for run in llamacpp:0.001:F16 llamacpp_f32:0.00001:F32; do
  IFS=: read -r file tolerance cache <<<"$run"
  python3 - "$name $cache cache" "$dir/$file.csv" "$dir/llama.csv" "$tolerance" <<'PY' || status=1
import csv, sys
name, lc_path, ll_path, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
lc = {r["policy"]: float(r["nll"]) for r in csv.DictReader(open(lc_path))}
ll = {}
for r in csv.DictReader(open(ll_path)):
    ll["full" if r["policy"] == "full" else r["policy"].split("/")[0]] = float(r["nll"])
bad = 0
for policy in ("full", "streaming"):
    a, b = lc[policy], ll[policy]
    ok = abs(a - b) <= tol
    bad += not ok
    print(f"{name} {policy}: llama.cpp {a:.6f}, examples/llama {b:.6f}, |diff| {abs(a - b):.2e} "
          f"{'within' if ok else 'ABOVE'} {tol}")
sys.exit(1 if bad else 0)
PY
  done
  ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || { echo "SKIPPED: no model found in $models"; exit 77; }
# The prefill protocol (P = 128 of 256 tokens, compressed once to B = 64 for
# every layer, the rest teacher-forced) with the F32 cache, against
# examples/llama at the same granularity (layers: the library's
# shared_layers<>): the default, H2O and SnapKV (the prompt's last 32
# queries observed) agree within 1e-5 nats.
dir=$out/cross_stories260K
if [ -f "$dir/sample1.tokens" ]; then
  "$lc" evaluate --model "$models/stories260K.gguf" --tokens "$dir"/sample1.tokens "$dir"/sample2.tokens --f32-cache \
    --flash-attn off \
    --protocol prefill --budget-tokens 64 --policies scissorhands h2o snapkv --csv "$dir/prefill_llamacpp.csv" \
    >"$dir/prefill_llamacpp.log" 2>&1
  "$ll" --model "$models/stories260K.gguf" --threads 1 evaluate --tokens "$dir"/sample1.tokens "$dir"/sample2.tokens \
    --protocol prefill:128 --granularity layers --policies scissorhands h2o snapkv --budgets 64 \
    --csv "$dir/prefill_llama.csv" --no-plot >"$dir/prefill_llama.log" 2>&1
  python3 - "$dir/prefill_llamacpp.csv" "$dir/prefill_llama.csv" <<'PY' || status=1
import csv, sys
lc = {r["policy"]: float(r["nll"]) for r in csv.DictReader(open(sys.argv[1]))}
ll = {r["policy"].split("/")[0]: float(r["nll"]) for r in csv.DictReader(open(sys.argv[2]))}
bad = 0
for policy in ("full", "scissorhands", "h2o", "snapkv"):
    a, b = lc[policy], ll[policy]
    ok = abs(a - b) <= 1e-5
    bad += not ok
    print(f"stories260K prefill F32 cache {policy}: llama.cpp {a:.6f}, examples/llama {b:.6f}, |diff| {abs(a - b):.2e} "
          f"{'within' if ok else 'ABOVE'} 1e-05")
sys.exit(1 if bad else 0)
PY
fi
exit $status
