#!/usr/bin/env bash
# Draws NLL against KV memory, one line per policy, from the CSV that
# `scissorhands_llama evaluate` writes. Usage: plot_nll.sh CSV PNG
# (gnuplot: Debian's gnuplot-nox, installed by scripts/setup.sh).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 results.csv plot.png" >&2
  exit 2
fi
csv=$1
png=$2
command -v gnuplot >/dev/null || { echo "plot_nll.sh: gnuplot not found (apt-get install gnuplot-nox, or bash scripts/setup.sh)" >&2; exit 1; }
[ -r "$csv" ] || { echo "plot_nll.sh: cannot read $csv" >&2; exit 1; }

data=$(mktemp)
trap 'rm -f "$data"' EXIT
# One gnuplot data block per policy (blank-line pairs separate blocks):
# x = % of the full cache's K/V held, y = NLL. The full cache is the line.
awk -F, 'NR > 1 && $1 != "full" { rows[$1] = rows[$1] sprintf("%.4f %.6f\n", 100 * $3, $7); if (!($1 in seen)) { seen[$1] = 1; order[n++] = $1 } }
         END { for (i = 0; i < n; i++) { printf "# %s\n%s\n\n", order[i], rows[order[i]] } }' "$csv" > "$data"
names=$(awk -F, 'NR > 1 && $1 != "full" && !($1 in s) { s[$1] = 1; printf "%s ", $1 }' "$csv")
full=$(awk -F, 'NR > 1 && $1 == "full" { print $7; exit }' "$csv")
[ -n "$names" ] || { echo "plot_nll.sh: no policy rows in $csv" >&2; exit 1; }

terminal="pngcairo size 900,560 font 'sans,11'"
gnuplot -e "set terminal $terminal" -e "print 1" >/dev/null 2>&1 || terminal="png size 900,560"
gnuplot <<GP
set terminal $terminal
set output '$png'
set title "stories260K: NLL against KV memory (teacher-forced; lower is better)"
set xlabel "KV cache held (% of the full cache, peak tokens per head and layer)"
set ylabel "mean NLL (nats / token)"
set key top right
set offsets 0, 0, graph 0.05, graph 0.05
set grid
names = "$names"
full = ${full:-0}
plot for [i = 1:words(names)] '$data' index (i - 1) using 1:2 with linespoints lw 2 pt (i + 5) title word(names, i), \
     full with lines dt 2 lc rgb "black" title sprintf("full cache (%.3f)", full)
GP
echo "plot_nll.sh: wrote $png"
