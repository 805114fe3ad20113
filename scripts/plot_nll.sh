#!/usr/bin/env bash
# Draws NLL against KV memory from the CSV that `scissorhands_llama evaluate`
# writes: one panel per protocol (decode; prefill:P...), one line per policy,
# the full cache dashed. A CSV holding several models (the `model` column,
# e.g. several runs' CSVs concatenated under one header) gets a panel per
# model and protocol, models side by side. Usage: plot_nll.sh CSV PNG
# (gnuplot: Debian's gnuplot-nox, installed by scripts/setup.sh).
#
# x axis: decode — KV cache held (% of the full cache's peak); prefill — the
# prompt's KV kept after compression (% of the P prompt tokens). The model's
# name comes from the CSV's `model` column (CSVs of earlier versions, without
# it, plot as one decode panel).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 results.csv plot.png" >&2
  exit 2
fi
csv=$1
png=$2
command -v gnuplot >/dev/null || { echo "plot_nll.sh: gnuplot not found (apt-get install gnuplot-nox, or bash scripts/setup.sh)" >&2; exit 1; }
[ -r "$csv" ] || { echo "plot_nll.sh: cannot read $csv" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Columns by name (the description column is quoted but holds no comma).
read -r -a header < <(head -1 "$csv" | tr ',' ' ')
col() { local i; for i in "${!header[@]}"; do [ "${header[$i]}" = "$1" ] && { echo $((i + 1)); return; }; done; echo 0; }
c_policy=$(col policy) c_kv=$(col kv_fraction) c_nll=$(col nll) c_model=$(col model) c_protocol=$(col protocol)
c_kept=$(col prompt_kv_fraction)
[ "$c_policy" -gt 0 ] && [ "$c_kv" -gt 0 ] && [ "$c_nll" -gt 0 ] || { echo "plot_nll.sh: $csv lacks policy/kv_fraction/nll columns" >&2; exit 1; }

models=stories260K
[ "$c_model" -gt 0 ] && models=$(awk -F, -v m="$c_model" 'NR > 1 && !($m in s) { s[$m] = 1; printf "%s ", $m }' "$csv")
read -r -a model_list <<<"$models"
model=${model_list[0]}
protocols=decode
[ "$c_protocol" -gt 0 ] && protocols=$(awk -F, -v p="$c_protocol" 'NR > 1 && !($p in s) { s[$p] = 1; printf "%s ", $p }' "$csv")

# Per protocol (and model): one gnuplot data block per policy (blank-line
# pairs separate blocks), x in %, y = NLL; the policy names; the full
# cache's NLL.
panels=0
wide=0
script="$work/plot.gp"
for proto in $protocols; do
for mdl in "${model_list[@]}"; do
  # The rows of this panel (model and protocol). Several models: a model
  # without this protocol (prefill:50% is prefill:250 on one model and
  # prefill:128 on another) has no panel for it.
  awk -F, -v cm="$c_model" -v mdl="$mdl" 'NR == 1 || cm == 0 || $cm == mdl' "$csv" > "$work/rows.csv"
  if [ ${#model_list[@]} -gt 1 ] && ! awk -F, -v proto="$proto" -v cp="$c_protocol" -v cpol="$c_policy" \
      'NR > 1 && (cp == 0 || $cp == proto) && $cpol != "full" { found = 1; exit } END { exit !found }' "$work/rows.csv"; then
    continue
  fi
  panels=$((panels + 1))
  data="$work/panel$panels.dat"
  awk -F, -v proto="$proto" -v cp="$c_protocol" -v cpol="$c_policy" -v ckv="$c_kv" -v cnll="$c_nll" -v ckept="$c_kept" '
    NR > 1 && (cp == 0 || $cp == proto) && $cpol != "full" {
      x = (proto ~ /^prefill/ && ckept > 0) ? $ckept : $ckv
      rows[$cpol] = rows[$cpol] sprintf("%.4f %.6f\n", 100 * x, $cnll)
      if (!($cpol in seen)) { seen[$cpol] = 1; order[n++] = $cpol }
    }
    END { for (i = 0; i < n; i++) printf "# %s\n%s\n\n", order[i], rows[order[i]] }' "$work/rows.csv" > "$data"
  names=$(awk -F, -v proto="$proto" -v cp="$c_protocol" -v cpol="$c_policy" \
    'NR > 1 && (cp == 0 || $cp == proto) && $cpol != "full" && !($cpol in s) { s[$cpol] = 1; printf "%s ", $cpol }' "$work/rows.csv")
  full=$(awk -F, -v proto="$proto" -v cp="$c_protocol" -v cpol="$c_policy" -v cnll="$c_nll" \
    'NR > 1 && (cp == 0 || $cp == proto) && $cpol == "full" { print $cnll; exit }' "$work/rows.csv")
  [ -n "$names" ] || { echo "plot_nll.sh: no policy rows for $proto ($mdl) in $csv" >&2; exit 1; }
  if [[ $proto == prefill* ]]; then
    prompt=${proto#prefill:}
    prompt=${prompt%%:*}
    k=""
    [[ $proto == prefill:*:* ]] && k=", last ${proto##*:} queries observed"
    title="$proto: $prompt-token prompt compressed once$k"
    xlabel="prompt KV kept after compression (% of the $prompt prompt tokens)"
    xrange="set xrange [0:100]"
  else
    title="decode: one token a step, compress at B"
    xlabel="KV cache held (% of the full cache, peak tokens per head and layer)"
    xrange="set xrange [0:*]"
  fi
  [ ${#model_list[@]} -gt 1 ] && title="$mdl — $title"
  # More than 8 lines: the colours repeat (the 9th on are dashed) and the
  # key goes beside the panel.
  key="set key top right"
  dashed=""
  if [ "$(wc -w <<<"$names")" -gt 8 ]; then
    key="set key outside right top"
    dashed="
     for [i = 9:words(names)] '$data' index (i - 1) using 1:2 with linespoints lw 2 pt (i + 5) dt 2 title word(names, i), \\"
    wide=1
  fi
  cat >> "$script" <<GP
$key
$xrange
set title "$title"
set xlabel "$xlabel"
names = "$names"
full = ${full:-0}
solid = words(names) < 8 ? words(names) : 8
plot for [i = 1:solid] '$data' index (i - 1) using 1:2 with linespoints lw 2 pt (i + 5) title word(names, i), \\$dashed
     full with lines dt 2 lc rgb "black" title sprintf("full cache (%.3f)", full)
GP
done
done

# One model: its protocols side by side. Several: models side by side, a
# row per protocol.
columns=${#model_list[@]}
[ "$columns" -eq 1 ] && columns=$panels
rows=$((panels / columns))
panel_width=560
[ "$wide" -eq 1 ] && panel_width=800
width=$((panel_width * columns + 40))
panel_height=460
[ "$wide" -eq 1 ] && panel_height=540
height=$((panel_height * rows))
terminal="pngcairo size $width,$height font 'sans,9'"
gnuplot -e "set terminal $terminal" -e "print 1" >/dev/null 2>&1 || terminal="png size $width,$height"
heading="$model: NLL against KV memory (teacher-forced; lower is better)"
[ ${#model_list[@]} -gt 1 ] && heading="${models% }: NLL against KV memory (teacher-forced; lower is better)"
{
  cat <<GP
set terminal $terminal
set output '$png'
set multiplot layout $rows,$columns title "$heading"
set ylabel "mean NLL (nats / token)"
set offsets 0, 0, graph 0.05, graph 0.05
set grid
GP
  cat "$script"
  echo "unset multiplot"
} | gnuplot
echo "plot_nll.sh: wrote $png"
