#!/usr/bin/env bash
# Draws NLL against KV memory from the CSV that `scissorhands_llama evaluate`
# writes: one panel per protocol (decode; prefill:P...), one line per policy,
# the full cache dashed. Usage: plot_nll.sh CSV PNG
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

model=stories260K
[ "$c_model" -gt 0 ] && model=$(awk -F, -v m="$c_model" 'NR == 2 { print $m; exit }' "$csv")
protocols=decode
[ "$c_protocol" -gt 0 ] && protocols=$(awk -F, -v p="$c_protocol" 'NR > 1 && !($p in s) { s[$p] = 1; printf "%s ", $p }' "$csv")

# Per protocol: one gnuplot data block per policy (blank-line pairs separate
# blocks), x in %, y = NLL; the policy names; the full cache's NLL.
panels=0
script="$work/plot.gp"
for proto in $protocols; do
  panels=$((panels + 1))
  data="$work/panel$panels.dat"
  awk -F, -v proto="$proto" -v cp="$c_protocol" -v cpol="$c_policy" -v ckv="$c_kv" -v cnll="$c_nll" -v ckept="$c_kept" '
    NR > 1 && (cp == 0 || $cp == proto) && $cpol != "full" {
      x = (proto ~ /^prefill/ && ckept > 0) ? $ckept : $ckv
      rows[$cpol] = rows[$cpol] sprintf("%.4f %.6f\n", 100 * x, $cnll)
      if (!($cpol in seen)) { seen[$cpol] = 1; order[n++] = $cpol }
    }
    END { for (i = 0; i < n; i++) printf "# %s\n%s\n\n", order[i], rows[order[i]] }' "$csv" > "$data"
  names=$(awk -F, -v proto="$proto" -v cp="$c_protocol" -v cpol="$c_policy" \
    'NR > 1 && (cp == 0 || $cp == proto) && $cpol != "full" && !($cpol in s) { s[$cpol] = 1; printf "%s ", $cpol }' "$csv")
  full=$(awk -F, -v proto="$proto" -v cp="$c_protocol" -v cpol="$c_policy" -v cnll="$c_nll" \
    'NR > 1 && (cp == 0 || $cp == proto) && $cpol == "full" { print $cnll; exit }' "$csv")
  [ -n "$names" ] || { echo "plot_nll.sh: no policy rows for $proto in $csv" >&2; exit 1; }
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
  cat >> "$script" <<GP
$xrange
set title "$title"
set xlabel "$xlabel"
names = "$names"
full = ${full:-0}
plot for [i = 1:words(names)] '$data' index (i - 1) using 1:2 with linespoints lw 2 pt (i + 5) title word(names, i), \\
     full with lines dt 2 lc rgb "black" title sprintf("full cache (%.3f)", full)
GP
done

width=$((560 * panels + 40))
terminal="pngcairo size $width,460 font 'sans,9'"
gnuplot -e "set terminal $terminal" -e "print 1" >/dev/null 2>&1 || terminal="png size $width,460"
{
  cat <<GP
set terminal $terminal
set output '$png'
set multiplot layout 1,$panels title "$model: NLL against KV memory (teacher-forced; lower is better)"
set ylabel "mean NLL (nats / token)"
set key top right
set offsets 0, 0, graph 0.05, graph 0.05
set grid
GP
  cat "$script"
  echo "unset multiplot"
} | gnuplot
echo "plot_nll.sh: wrote $png"
