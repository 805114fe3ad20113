#!/usr/bin/env bash
# persistence_check.sh LLAMACPP_BIN LLAMA_BIN MODEL OUTDIR: the persistence
# ratio per layer measured on llama.cpp's attention (scissorhands_llamacpp
# persistence, F32 K/V cache) against the project's own decoder
# (examples/llama persistence) on the same token files, with a minimum age
# and with a minimum fraction of steps: every layer's ratio
# and chance agree within 0.2 points of a percent (examples/llama prints one
# decimal; a borderline token may cross the threshold in one and not the
# other). Then the definition's fixed points on llama.cpp: alpha near 0
# makes every token pivotal at every step (ratio = chance = 1).
set -euo pipefail
lc=$1 ll=$2 model=$3 out=$4
if [ ! -f "$model" ]; then echo "SKIPPED: $model not found"; exit 77; fi
dir=$out/persistence; rm -rf "$dir"; mkdir -p "$dir"
"$lc" persistence --model "$model" --samples 3 --length 256 --save-tokens "$dir" --f32-cache --min-age 10 \
  --csv "$dir/llamacpp.csv" >"$dir/llamacpp.log" 2>&1
"$ll" --model "$model" --threads 1 persistence --tokens "$dir"/sample*.tokens --min-age 10 >"$dir/llama.log" 2>&1
"$lc" persistence --model "$model" --tokens "$dir"/sample*.tokens --f32-cache --min-fraction 0.1 \
  --csv "$dir/llamacpp_q.csv" >"$dir/llamacpp_q.log" 2>&1
"$ll" --model "$model" --threads 1 persistence --tokens "$dir"/sample*.tokens --min-fraction 0.1 >"$dir/llama_q.log" 2>&1
"$lc" persistence --model "$model" --tokens "$dir"/sample*.tokens --alpha 1e-9 --csv "$dir/all.csv" >"$dir/all.log" 2>&1
python3 - "$dir" <<'PY'
import csv, re, sys
d = sys.argv[1]
bad = 0
for lc_name, ll_name, what in (("llamacpp", "llama", "min age 10"), ("llamacpp_q", "llama_q", "min fraction 0.1")):
    lc = list(csv.DictReader(open(f"{d}/{lc_name}.csv")))
    ll = []
    for line in open(f"{d}/{ll_name}.log"):
        m = re.match(r"\s*(\d+)\s+([\d.]+)%\s+([\d.]+)%", line)
        if m:
            ll.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
    if len(ll) != len(lc) or not lc:
        print(f"{what}: layers: llama.cpp {len(lc)}, examples/llama {len(ll)}")
        bad += 1
    for r, (layer, ratio, chance) in zip(lc, ll):
        a, c = 100 * float(r["persistence"]), 100 * float(r["chance"])
        ok = int(r["layer"]) == layer and abs(a - ratio) <= 0.2 and abs(c - chance) <= 0.2
        bad += not ok
        print(f"{what}, layer {layer}: persistence {a:.2f}% / {ratio:.1f}%, chance {c:.2f}% / {chance:.1f}% "
              f"(llama.cpp / examples/llama) {'agree' if ok else 'DIFFER'}")
for r in csv.DictReader(open(f"{d}/all.csv")):
    ok = float(r["persistence"]) == 1.0 and float(r["chance"]) == 1.0
    bad += not ok
    print(f"layer {r['layer']} at alpha 1e-9: persistence {r['persistence']}, chance {r['chance']} "
          f"{'(1, 1)' if ok else 'EXPECTED 1 and 1'}")
sys.exit(1 if bad else 0)
PY
