#!/usr/bin/env bash
# Eviction granularity on the three models of ../shared/models
# (docs/granularity.md): the library's default policy (scissorhands_policy)
# at per_head, shared_heads (mean, max) and shared_layers (the four
# head/layer reductions), H2O at per_head and at the four shared_layers
# reductions, and random (per_head and shared_layers) as the floor. Same
# texts, budgets and protocols as scripts/main.sh (16 sampled texts of
# min(500, trained context) tokens; 3.125-50% of the text; decode and
# prefill:50%).
#
# Writes results/granularity_<model>.csv (and .png, a panel per protocol),
# results/granularity.csv (every model), results/granularity_<protocol>.png
# (a panel per model) and prints the summary tables of docs/granularity.md
# (`bash scripts/granularity.sh --summary results/granularity.csv` prints
# them again from a CSV without running anything). Extra arguments go to every model's
# `scissorhands_llama evaluate` (e.g. --samples 4, or --protocol decode to
# skip the prefill). $SCISSORHANDS_MODEL, $SCISSORHANDS_MODELS_DIR and
# $SCISSORHANDS_BUILD_DIR as for scripts/main.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# The summary of a granularity CSV: per protocol, every policy's mean NLL
# increase (points of %) over the models and budgets that every policy of
# the protocol ran (babyllama105 cannot run 3.125% = 8 tokens with r = 10),
# then per model and per budget for scissorhands, and the reductions
# compared pairwise.
summary() {
  local csv=$1
  awk -F, '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $col["policy"] == "full" { next }
    {
      pr = $col["protocol"]; sub(/:.*/, "", pr)  # decode, prefill (P = 50% of each model'"'"'s texts)
      po = $col["policy"]; mo = $col["model"]; bf = sprintf("%.4g", 100 * $col["budget_fraction"])
      inc[pr, po, mo, bf] = 100 * $col["relative_increase"]
      if (!((pr, po) in seenp)) { seenp[pr, po] = 1; pols[pr] = pols[pr] " " po }
      if (!((pr, mo, bf) in seenc)) { seenc[pr, mo, bf] = 1; cells[pr] = cells[pr] " " mo "|" bf }
      if (!(pr in seenpr)) { seenpr[pr] = 1; prs = prs " " pr }
    }
    END {
      np = split(prs, P, " ")
      for (a = 1; a <= np; a++) {
        pr = P[a]
        n = split(pols[pr], L, " "); nc = split(cells[pr], C, " ")
        # Cells every policy ran.
        k = 0
        for (c = 1; c <= nc; c++) {
          split(C[c], mb, "|"); all = 1
          for (i = 1; i <= n; i++) if (!((pr, L[i], mb[1], mb[2]) in inc)) all = 0
          if (all) { k++; M[k] = mb[1]; B[k] = mb[2] }
        }
        printf "Protocol %s: mean NLL increase over %d (model, budget) cells every policy ran\n", pr, k
        for (i = 1; i <= n; i++) {
          s = 0; for (j = 1; j <= k; j++) s += inc[pr, L[i], M[j], B[j]]
          printf "  %-30s %+7.2f%%\n", L[i], s / k
        }
        # Pairwise: max vs mean head reduction, and layer reduction.
        printf "  per cell, scissorhands (model budget%%: head, heads-mean, heads-max, layers-mean, layers-max, layers-mean-max, layers-max-mean)\n"
        for (j = 1; j <= k; j++) {
          printf "    %-16s %6s", M[j], B[j]
          split("scissorhands scissorhands/heads-mean scissorhands/heads-max scissorhands/layers-mean scissorhands/layers-max scissorhands/layers-mean-max scissorhands/layers-max-mean", S, " ")
          for (x = 1; x <= 7; x++) printf " %+6.1f", ((pr, S[x], M[j], B[j]) in inc) ? inc[pr, S[x], M[j], B[j]] : 0
          printf "\n"
        }
      }
    }' "$csv"
}
if [ "${1:-}" = "--summary" ]; then
  summary "${2:-results/granularity.csv}"
  exit 0
fi

bash scripts/setup.sh

source scripts/build_llama.sh  # sets bin, creates results/

find_models granularity.sh
[ ${#models[@]} -gt 0 ] || { echo "granularity.sh: no model found" >&2; exit 1; }

# Labels are preset/granularity (e.g. scissorhands/layers-max); plain
# "scissorhands", "h2o", "random" are per_head, as in scripts/main.sh.
policies=(
  scissorhands
  scissorhands:gran=heads-mean scissorhands:gran=heads-max
  scissorhands:gran=layers-mean scissorhands:gran=layers-max
  scissorhands:gran=layers-mean-max scissorhands:gran=layers-max-mean
  h2o
  h2o:gran=layers-mean h2o:gran=layers-max h2o:gran=layers-mean-max h2o:gran=layers-max-mean
  random random:gran=layers-mean
)

start=$SECONDS
evaluate_models granularity --policies "${policies[@]}" "$@"

# One plot per protocol (decode; prefill, whose P is 50% of each model's
# texts), a panel per model.
c_protocol=$(head -1 results/granularity.csv | tr ',' '\n' | grep -nx protocol | cut -d: -f1)
for tag in $(awk -F, -v p="$c_protocol" 'NR > 1 { t = $p; sub(/:.*/, "", t); if (!(t in s)) { s[t] = 1; print t } }' \
             results/granularity.csv); do
  awk -F, -v p="$c_protocol" -v tag="$tag" 'NR == 1 || $p == tag || index($p, tag ":") == 1' results/granularity.csv \
    > "results/granularity_$tag.csv"
  bash scripts/plot_nll.sh "results/granularity_$tag.csv" "results/granularity_$tag.png" || true
done

echo
summary results/granularity.csv
echo
echo "granularity.sh: ${#csvs[@]} model(s) in $((SECONDS - start)) s; results/granularity.csv holds every row,"
echo "results/granularity_<protocol>.png a panel per model"
