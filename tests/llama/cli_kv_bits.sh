#!/usr/bin/env bash
# --kv-bits and --kv-group end to end on one model of ../shared/models:
# usage cli_kv_bits.sh BINARY MODEL.gguf WORKDIR GOLDEN.csv. Exit 77 (CTest:
# skipped) when the model is absent. Checks that
#  - the default and --kv-bits 32 give the NLL, K/V and state bytes that the
#    binary gave before --kv-bits existed (GOLDEN.csv, written by the build of
#    commit a24e8de on x86-64, Release), under decode and prefill;
#  - --kv-bits 16, 8 and 4 run both protocols, their rows hold fewer K/V
#    bytes (values or codes plus parameters) than fp32 at every budget, the
#    bf16 values exactly half, and every row carries the fp32 reference NLL;
#  - a bad --kv-bits, a --kv-group that does not divide head_dim (or is odd
#    with 4 bits, or comes with 32 or 16 bits), and a policy not built for a
#    quantized cache are refused before any work, naming the option.
set -uo pipefail
bin=$1
model=$2
work=$3
golden=$4
source "$(dirname "$0")/cli_common.sh"  # name, the skip (exit 77), check and fail
# A column of a CSV by name: col CSV NAME prints the values, header dropped.
col() {
  awk -F, -v name="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) c = i; next } { print $c }' "$1"
}
# The columns the golden file holds, in its order, from a CSV of this binary.
golden_view() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    { print $c["protocol"] "," $c["policy"] "," $c["budget"] "," $c["nll"] "," $c["kv_kib"] "," $c["state_kib"] }' "$1"
}

grid=(--threads 1 evaluate --samples 2 --length 96 --budgets 16,32 --policies scissorhands h2o streaming
      --protocol decode prefill:48 --no-plot)
# (streaming is not built for a bf16 or quantized cache.)
low_grid=(--threads 1 evaluate --samples 2 --length 96 --budgets 16,32 --policies scissorhands h2o
          --protocol decode prefill:48 --no-plot)
# Each row of a CSV keyed by protocol, policy and budget, with the named columns: keyed CSV NAME...
keyed() {
  local csv=$1
  shift
  awk -F, -v names="$*" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; n = split(names, want, " "); next }
    { line = $c["protocol"] "/" $c["policy"] "/" $c["budget"]; for (j = 1; j <= n; j++) line = line "," $c[want[j]]; print line }' \
    "$csv" | sort
}
# Rows of the fp32 run and of CSV side by side (key, fp32 columns, CSV columns), the rows both hold.
beside() {  # beside CSV NAME...
  local csv=$1
  shift
  join -t, <(keyed "$work/kv32.csv" "$@") <(keyed "$csv" "$@")
}

# fp32: the default and --kv-bits 32, against the golden output.
"$bin" --model "$model" "${grid[@]}" --csv "$work/default.csv" > "$work/default.out" 2>&1
check "evaluate with the default format runs" test $? -eq 0
"$bin" --model "$model" --kv-bits 32 "${grid[@]}" --csv "$work/kv32.csv" > "$work/kv32.out" 2>&1
check "evaluate --kv-bits 32 runs" test $? -eq 0
check "--kv-bits 32 writes the default's CSV byte for byte, timings aside" \
  cmp <(cut -d, -f1-9,14- "$work/default.csv") <(cut -d, -f1-9,14- "$work/kv32.csv")
check "the default's NLL, K/V and state bytes are those before --kv-bits existed ($golden)" \
  cmp <(tail -n +2 "$golden") <(golden_view "$work/default.csv")
check "fp32 rows say kv_bits 32 and hold no parameters" \
  test "$(tail -n +2 "$work/kv32.csv" | awk -F, '$20 != 32 || $22 != "0.000"' | wc -l)" = 0

# 16, 8 and 4 bits.
for bits in 16 8 4; do
  csv="$work/kv$bits.csv"
  "$bin" --model "$model" --kv-bits "$bits" "${low_grid[@]}" --csv "$csv" > "$work/kv$bits.out" 2>&1
  check "evaluate --kv-bits $bits runs" test $? -eq 0
  check "--kv-bits $bits: 10 rows (2 protocols x (full + 2 policies x 2 budgets))" \
    test "$(beside "$csv" nll | wc -l)" = 10
  check "--kv-bits $bits: every row says kv_bits $bits" test "$(col "$csv" kv_bits | sort -u)" = "$bits"
  # Row by row against fp32: K/V values or codes plus their parameters hold fewer bytes.
  check "--kv-bits $bits: every row holds fewer K/V bytes than fp32 (codes + parameters)" \
    test "$(beside "$csv" kv_kib kv_param_kib | awk -F, '!($4 + $5 < $2)' | wc -l)" = 0
  check "--kv-bits $bits: every row's total (K/V + parameters + state) is below fp32's" \
    test "$(beside "$csv" total_kib | awk -F, '!($3 < $2)' | wc -l)" = 0
  check "--kv-bits $bits: the state is fp32's (the library's, whatever the cache holds)" \
    test "$(beside "$csv" state_kib | awk -F, '$3 != $2' | wc -l)" = 0
  check "--kv-bits $bits: nll_fp32 is the fp32 full cache's NLL" \
    test "$(paste -d, <(col "$csv" protocol) <(col "$csv" nll_fp32) | sort -u)" = \
         "$(paste -d, <(col "$work/kv32.csv" protocol) <(col "$work/kv32.csv" policy) <(col "$work/kv32.csv" nll) |
            awk -F, '$2 == "full" { print $1 "," $3 }' | sort -u)"
  check "--kv-bits $bits: the table names the format and the fp32 reference" \
    grep -aq "the full fp32 cache's" "$work/kv$bits.out"
done
check "bf16 holds exactly half the fp32 bytes" \
  test "$(beside "$work/kv16.csv" kv_kib | awk -F, '$3 * 2 != $2' | wc -l)" = 0
check "int8 and int4 hold parameters" \
  test "$(cat <(col "$work/kv8.csv" kv_param_kib) <(col "$work/kv4.csv" kv_param_kib) | awk '!($1 > 0)' | wc -l)" = 0

# Refusals: non-zero exit, the option named, nothing written.
refused() {  # refused DESCRIPTION PATTERN ARGS...
  local what=$1 pattern=$2
  shift 2
  local out rc
  out=$("$bin" --model "$model" "$@" evaluate --samples 1 --length 32 --no-plot --csv "$work/never.csv" 2>&1)
  rc=$?
  check "$what is refused (exit status $rc)" test "$rc" -ne 0
  check "$what: the message says '$pattern'" grep -aq -- "$pattern" <<<"$out"
  check "$what: nothing was written" test ! -e "$work/never.csv"
}
head_dim=$("$bin" --model "$model" info | sed -n 's/.*, head_dim \([0-9]*\),.*/\1/p')
check "info reports head_dim ($head_dim)" test -n "$head_dim"
refused "--kv-bits 7" "--kv-bits must be 32 (fp32), 16 (bf16), 8 (int8 codes) or 4 (int4 codes), got 7" --kv-bits 7
refused "--kv-bits abc" "--kv-bits" --kv-bits abc
refused "--kv-group 3" "--kv-group 3 must divide the model's head_dim = $head_dim" --kv-bits 8 --kv-group 3
refused "--kv-group $((2 * head_dim))" "--kv-group $((2 * head_dim)) must divide the model's head_dim = $head_dim" \
  --kv-bits 4 --kv-group $((2 * head_dim))
refused "--kv-group 1 with 4 bits" "--kv-group 1 must be even with --kv-bits 4" --kv-bits 4 --kv-group 1
refused "--kv-group 0" "--kv-group" --kv-bits 8 --kv-group 0
refused "--kv-group with 16 bits" "--kv-group 8 applies to --kv-bits 8 or 4 only" --kv-bits 16 --kv-group 8
out=$("$bin" --model "$model" --kv-bits 8 evaluate --samples 1 --length 32 --policies tova --no-plot \
      --csv "$work/never.csv" 2>&1)
rc=$?
check "tova on an int8 cache is refused (exit status $rc)" test "$rc" -ne 0
check "the refusal names --kv-bits 8 and the policy" grep -aq -- "--kv-bits 8: policy tova" <<<"$out"
check "nothing was written for it" test ! -e "$work/never.csv"
# Without --policies a quantized cache runs the default grid's policies it can.
out=$("$bin" --model "$model" --kv-bits 4 --threads 1 evaluate --samples 1 --length 48 --budgets 16 --no-plot \
      --csv "$work/defaults4.csv" 2>&1)
check "--kv-bits 4 with the default policies runs" test $? -eq 0
check "... the default and h2o among them" \
  test "$(col "$work/defaults4.csv" policy | grep -cxE 'scissorhands|h2o')" = 2
exit $fail
