#!/usr/bin/env bash
# The CLI on one model of ../shared/models: usage cli_models.sh BINARY MODEL.gguf WORKDIR.
# Exit 77 (CTest: skipped) when the model is absent. Checks that
#  - evaluate refuses --length past the model's trained context, naming the
#    option, the value, the model and its context;
#  - generate clamps --steps to the context with a note saying so;
#  - a --tokens file longer than the context is cut to it, with a note;
#  - evaluate under decode and prefill:P writes the CSV with the model and
#    protocol columns, and the prefill cell with B >= P equals the full cache;
#  - --granularity applies to every spec (a spec's gran= wins), both
#    protocols run at layers-* and heads-*, and a layers-* granularity with a
#    non-uniform --allocator is refused before any work.
set -uo pipefail
bin=$1
model=$2
work=$3
source "$(dirname "$0")/cli_common.sh"  # name, the skip (exit 77), check and fail

# The trained context, as the CLI reports it.
context=$("$bin" --model "$model" info | sed -n 's/^  trained context \([0-9]*\) tokens.*/\1/p')
check "info reports a trained context ($context)" test -n "$context"
case $name in
  stories260K | tinystories656k) check "$name's context is 512" test "$context" = 512 ;;
  babyllama105) check "$name's context is 256" test "$context" = 256 ;;
esac

# --length past the context: refused, exit status non-zero, the message names it all.
over=$((context + 1))
out=$("$bin" --model "$model" evaluate --samples 1 --length "$over" --no-plot --csv "$work/never.csv" 2>&1)
rc=$?
check "--length $over is refused (exit status $rc)" test "$rc" -ne 0
check "the refusal names --length, $over, $name and $context" \
  grep -aq -- "--length $over is beyond $name's trained context of $context tokens" <<<"$out"
check "nothing was written" test ! -e "$work/never.csv"
# --context lifts it (an explicit override).
out=$("$bin" --model "$model" --context "$over" evaluate --samples 1 --length "$over" --budgets 32 --policies h2o \
      --no-plot --threads 1 --csv "$work/override.csv" 2>&1)
check "--context $over accepts --length $over" test $? -eq 0
check "the override is reported" grep -aq "trained context $over tokens (--context" <<<"$out"

# generate: --steps past the context is clamped, with a note.
out=$("$bin" --model "$model" generate --policy full --no-stop -n $((context + 50)) 2>&1)
check "generate with too many --steps runs" test $? -eq 0
check "the clamp note names --steps and the context" \
  grep -aq -- "note: --steps $((context + 50)) after a 1-token prompt would run past $name's trained context of $context tokens (.*): generating at most $((context - 1))" <<<"$out"
check "generate stops at the context" grep -aq "^$context tokens; KV cache" <<<"$out"

# A token file longer than the context is evaluated up to the context.
seq 1 $((context + 20)) | awk '{ print 5 }' > "$work/long.tokens"
out=$("$bin" --model "$model" evaluate --tokens "$work/long.tokens" --budgets 32 --policies h2o --no-plot --threads 1 \
      --csv "$work/long.csv" 2>&1)
check "a long --tokens file runs" test $? -eq 0
check "the cut is noted" grep -aq "note: --tokens $work/long.tokens holds $((context + 20)) tokens, beyond $name's trained context of $context tokens (.*): evaluating its first $context" <<<"$out"

# Both protocols, one CSV.
csv="$work/both.csv"
"$bin" --model "$model" --threads 1 evaluate --samples 1 --length 96 --protocol decode prefill:48 prefill:48:8 \
  --budgets 16,24,48 --policies h2o streaming --csv "$csv" --plot "$work/both.png" > "$work/both.out" 2>&1
check "evaluate with both protocols runs" test $? -eq 0
header=$(head -1 "$csv")
check "the CSV keeps its columns and adds model and protocol, then the KV format's" test "$header" = \
  "policy,budget,kv_fraction,kv_kib,state_kib,predictions,nll,nll_full,relative_increase,library_s,compress_s,step_s,library_fraction,description,model,protocol,prompt,prompt_kv_fraction,budget_fraction,kv_bits,kv_group,kv_param_kib,total_kib,nll_fp32,state_slot_kib"
check "every row names the model" test "$(awk -F, 'NR > 1 && $15 != "'"$name"'"' "$csv" | wc -l)" = 0
for p in decode prefill:48 prefill:48:8; do
  check "rows for $p: full + 2 policies x 3 budgets" test "$(awk -F, -v p="$p" 'NR > 1 && $16 == p' "$csv" | wc -l)" = 7
done
check "prefill at B = P (48) equals the full cache's NLL exactly" test \
  "$(awk -F, '$16 ~ /^prefill/ && $2 == 48 && $7 != $8' "$csv" | wc -l)" = 0
check "prefill at B = 16 < P differs from the full cache" test \
  "$(awk -F, '$16 == "prefill:48" && $2 == 16 && $7 != $8' "$csv" | wc -l)" = 2
check "the decode and prefill tables were printed" grep -aq "Protocol prefill:48 (prompt of 48 tokens" "$work/both.out"
check "the plot was drawn" test -s "$work/both.png"

# Granularity.
gcsv="$work/gran.csv"
"$bin" --model "$model" --threads 1 evaluate --samples 1 --length 96 --protocol decode prefill:48 --budgets 24 \
  --policies h2o scissorhands:gran=heads-max --granularity layers-max --no-plot --csv "$gcsv" > "$work/gran.out" 2>&1
check "evaluate at layers-max and heads-max runs both protocols" test $? -eq 0
check "--granularity labels h2o/layers-max, the spec's gran= wins" test \
  "$(awk -F, 'NR > 1 && $2 == 24 { print $1 }' "$gcsv" | sort -u | tr '\n' ' ')" = "h2o/layers-max scissorhands/heads-max "
check "rows: 2 protocols x (full + 2 policies)" test "$(tail -n +2 "$gcsv" | wc -l)" = 6
out=$("$bin" --model "$model" evaluate --samples 1 --length 96 --budgets 24 --policies h2o --granularity layers-mean \
      --allocator ramp --no-plot --csv "$work/gran_never.csv" 2>&1)
rc=$?
check "layers-mean with --allocator ramp is refused (exit status $rc)" test "$rc" -ne 0
check "the refusal says why" grep -aq "needs the same budget in every layer" <<<"$out"
check "nothing was written for it" test ! -e "$work/gran_never.csv"
exit $fail
