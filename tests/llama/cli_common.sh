# Sourced by cli_models.sh and cli_kv_bits.sh once they have set bin, model
# and work: sets name (the model's), exits 77 (CTest: skipped) when the
# model is absent, creates the work folder, and defines check, which
# records a failure in fail (the scripts' exit status) and goes on.
name=$(basename "$model" .gguf)
if [ ! -f "$model" ]; then
  echo "$(basename "$0"): skipped, $model not found (../shared/models/README.md lists the models)" >&2
  exit 77
fi
mkdir -p "$work"
fail=0
check() {  # check DESCRIPTION COMMAND...: the command must succeed
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what" >&2; fail=1; fi
}
