#!/usr/bin/env bash
# run.sh MODE BINARY MODEL OUTDIR: one check of the llama.cpp integration on
# a tiny model (exit 77 when the model is absent).
set -euo pipefail
mode=$1 bin=$2 model=$3 out=$4
if [ ! -f "$model" ]; then
  echo "SKIPPED: $model not found (../shared/models/README.md)"
  exit 77
fi
text=/usr/share/common-licenses/GPL-3
case "$mode" in
  check-reads)
    # Every logit of the glue's run (observing every layer, never evicting)
    # equals the stock run's; chunks of 32 and of 1 token per decode; with
    # flash attention as llama.cpp defaults it (on: the scores recomputed
    # from the queries) and off (llama.cpp's probabilities).
    "$bin" check-reads --model "$model" --text "$text" --length 300 --chunk 32
    "$bin" check-reads --model "$model" --text "$text" --length 64 --chunk 1
    "$bin" check-reads --model "$model" --text "$text" --length 300 --chunk 32 --flash-attn off ;;
  generate)
    # n_ctx 256 cells serving 1,000 generated tokens: no decode failure, never
    # above the budget, true positions (the program's exit status says so).
    "$bin" generate --model "$model" --ctx 256 -n 1000 --quiet
    "$bin" generate --model "$model" --ctx 256 -n 300 --quiet --policy h2o
    "$bin" generate --model "$model" --ctx 256 -n 300 --quiet --flash-attn off ;;
  flash)
    # Flash attention's observation (recomputed from the queries and the K
    # cells, the flash-attention path's code) against llama.cpp's
    # probabilities of the same queries and keys: at least 99% of the
    # evictions choose the same positions, ties aside (it is 100% here);
    # also printed: a flash-attention context against a probabilities one.
    for policy in scissorhands tova h2o; do
      "$bin" agree --model "$model" --text "$text" /usr/share/common-licenses/Apache-2.0 --length 400 \
        --budgets 64 128 --chunk 8 --policy "$policy" --min-agreement 99
    done ;;
  sequences)
    # Five texts interleaved in four sequences of one context (each
    # llama_decode carries a step of every sequence; the fifth text restarts
    # a sequence the first one ended) against each text alone: the same
    # positions evicted (>= 99%) and each text's NLL within the tolerance.
    # One stream per sequence: llama.cpp computes exactly as alone. The
    # unified cache: within 1e-4 with flash attention off; with it on,
    # llama.cpp's CPU kernel accumulates V in fp16 in cell order, and the
    # cells of a sequence lie in another order than alone once evictions
    # freed some, so its logits move by up to ~3e-4 (a policy whose choice
    # depends on no score, streaming, shows it): 1e-3 there, and TOVA's
    # continuous scores make the same choices.
    texts=("$text" /usr/share/common-licenses/GPL-2 /usr/share/common-licenses/Apache-2.0
           /usr/share/common-licenses/MPL-1.1 /usr/share/common-licenses/LGPL-2.1)
    args=(interleave --model "$model" --text "${texts[@]}" --length 400 --budget 64 --chunk 8 --sequences 4)
    "$bin" "${args[@]}" --cache streams --tolerance 0
    "$bin" "${args[@]}" --cache both --flash-attn off --tolerance 1e-4
    "$bin" "${args[@]}" --cache unified --policy tova --tolerance 1e-3
    "$bin" "${args[@]}" --cache unified --policy streaming --tolerance 1e-3 ;;
  refusals)
    # Engine mistakes refused with a message naming them, nothing evicted.
    "$bin" check-refusals --model "$model" ;;
  settings)
    # A preset with settings in its name runs as set and is labelled so; a
    # bad setting is refused before any run, naming the setting and its bounds.
    "$bin" evaluate --model "$model" --text "$text" --length 200 --budgets 50 --chunk 8 \
      --policies "scissorhands:recent=25%/window=50" "h2o:normalize=1" --csv "$out/settings.csv" >"$out/settings.log" 2>&1
    grep -q '^stories260K.gguf,decode,scissorhands:recent=25%/window=50,50.00%,100,' "$out/settings.csv"
    grep -q '^stories260K.gguf,decode,h2o:normalize=1,50.00%,100,' "$out/settings.csv"
    if "$bin" evaluate --model "$model" --text "$text" --length 200 --policies "scissorhands:recent=120%" \
        >"$out/refused.log" 2>&1; then echo "recent=120% was accepted"; exit 1; fi
    grep -q "setting 'recent=120%' is not one of .*recent (cells, or 0-100%)" "$out/refused.log"
    if grep -q "full cache" "$out/refused.log"; then echo "the bad setting was refused only after a run"; exit 1; fi
    echo "settings: run as set, labelled, a bad one refused before any run" ;;
  evaluate)
    # The sweep's shortcuts change no figure: texts run two at once give the
    # same CSV as one at a time, and the predictions reused from the full
    # cache (decode, before a method's first eviction or context shift) match
    # recomputing them to llama.cpp's batch-shape rounding (1e-4 relative).
    # The decode steps end at the budget: no bounded method holds more.
    args=(evaluate --model "$model" --text "$text" /usr/share/common-licenses/Apache-2.0 --length 300
          --budgets 10 25 50 --chunk 16 --policies scissorhands tova context-shift)
    "$bin" "${args[@]}" --jobs 2 --csv "$out/jobs2.csv" --texts-csv "$out/jobs2_texts.csv" >"$out/jobs2.log" 2>&1
    "$bin" "${args[@]}" --jobs 1 --csv "$out/jobs1.csv" >"$out/jobs1.log" 2>&1
    "$bin" "${args[@]}" --jobs 1 --no-reuse --csv "$out/no_reuse.csv" >"$out/no_reuse.log" 2>&1
    # policy, budget, budget_tokens, predictions, nll, peak_cells, reused
    columns() { awk -F, 'NR > 1 { print $3, $4, $5, $7, $8, $11, $15 }' "$1"; }
    if ! diff <(columns "$out/jobs1.csv") <(columns "$out/jobs2.csv"); then
      echo "--jobs 2 changed the figures"; exit 1
    fi
    paste -d' ' <(columns "$out/jobs1.csv") <(columns "$out/no_reuse.csv") | awk '
      $1 == "full" { next }
      { cells++
        if ($7 <= 0 || $14 != 0) { print $1, $2 ": reused " $7 " / " $14 " predictions"; bad++ }
        d = $5 - $12; if (d < 0) d = -d
        if (d > 1e-4 * $12) { print $1, $2 ": NLL " $5 " reused, " $12 " recomputed"; bad++ }
        if ($1 != "context-shift" && $6 > $3) { print $1, $2 ": held " $6 " cells, budget " $3; bad++ } }
      END { if (bad || cells != 9) { print bad " failure(s) in " cells " cells"; exit 1 }
            print cells " cells: the same with --jobs 2, reuse within 1e-4, never above the budget" }'
    # The per-text sums add up to each cell's pooled NLL, and the summary's
    # paired margin is the difference of the pooled increases.
    python3 - "$out/jobs2.csv" "$out/jobs2_texts.csv" "$(dirname "$0")/../../scripts/gemma_summary.py" <<'PY'
import csv, subprocess, sys
cells = {(r["policy"], r["budget"]): r for r in csv.DictReader(open(sys.argv[1]))}
sums = {}
for r in csv.DictReader(open(sys.argv[2])):
    s = sums.setdefault((r["policy"], r["budget"]), [0.0, 0, 0.0, 0])
    s[0] += float(r["nll_sum"]); s[1] += int(r["predictions"]); s[2] += float(r["nll_full_sum"]); s[3] += 1
assert sums.keys() == cells.keys(), (sorted(sums), sorted(cells))
for key, (nll, n, full, texts) in sums.items():
    c = cells[key]
    assert texts == 2 and n == int(c["predictions"]), (key, texts, n)
    assert abs(nll / n - float(c["nll"])) < 2e-6 and abs(full / n - float(c["nll_full"])) < 2e-6, key
out = subprocess.run([sys.executable, sys.argv[3], "--texts", sys.argv[2], "--", sys.argv[1]], check=True,
                     capture_output=True, text=True).stdout
row = next(l for l in out.splitlines() if l.startswith("| 25.00% | ") and "[" in l)
tova = row.split("|")[4].strip()  # streaming, h2o, tova, ...: "+m [lo, hi]"
margin = float(tova.split()[0])
lo, hi = (float(x) for x in tova[tova.index("[") + 1:tova.index("]")].split(","))
want = float(cells[("scissorhands", "25.00%")]["increase_percent"]) - float(cells[("tova", "25.00%")]["increase_percent"])
assert abs(margin - want) < 0.006 and lo <= margin <= hi, (tova, want)
print(f"per-text sums match the {len(cells)} cells; paired margin at 25%: {tova}")
PY
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
